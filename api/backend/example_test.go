package backend_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/relayhq/relay/api/backend"
)

func ExampleEmit() {
	res, err := backend.Emit(context.Background(), nil, emitURL, secretKey, "orders:42", map[string]any{"status": "shipped"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.OK, res.Channel, res.SubscriberCount, res.RateLimit.Limit, res.RateLimit.Remaining)
	// Output: true orders:42 0 600 599
}

func ExampleEmit_error() {
	_, err := backend.Emit(context.Background(), nil, emitURL, "sk_live_wrong", "orders:42", 1)
	fmt.Println(err)
	// Output: relay: 401 invalid_secret_key
}

func ExampleMintClientEmitToken() {
	token, err := backend.MintClientEmitToken(backend.TokenOptions{
		Secret:    "the project's client-emit secret",
		ProjectID: "5f0c8a52-3a83-4a4c-9d8e-2f3b6c1d7e90",
		Channel:   "doc:7",
		ClientID:  "user-17",
		Types:     []string{"cursor"},
		TTL:       5 * time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(strings.Count(token, "."), strings.HasPrefix(token, "eyJ"))
	// Output: 2 true
}

func ExampleRevokeClientEmitToken() {
	err := backend.RevokeClientEmitToken(context.Background(), backend.RevokeOptions{
		EmitURL:   emitURL, // the revoke address is derived from it
		SecretKey: secretKey,
		ClientID:  "user-17",
	})
	fmt.Println(err)
	// Output: <nil>
}
