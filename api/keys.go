package api

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// Key prefixes (proto/PROTOCOL.md › Keys).
const (
	PublicKeyPrefix = "pk_live_"
	SecretKeyPrefix = "sk_live_"
)

// newRawKey returns prefix + 32 base64url characters (192 random bits).
func newRawKey(prefix string) string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the OS RNG never fails on Linux
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// keyDigest is the SHA-256 of a raw key. The store keeps its hex form
// (HashKey); the key index keys its maps by the raw digest, half the size.
type keyDigest [sha256.Size]byte

func digestKey(raw string) keyDigest {
	var buf [128]byte // keys are far shorter: hashed from the stack, no copy on the heap
	if len(raw) <= len(buf) {
		return sha256.Sum256(buf[:copy(buf[:], raw)])
	}
	return sha256.Sum256([]byte(raw))
}

// HashKey is the SHA-256 hex digest under which a raw key is stored and looked up.
func HashKey(raw string) string {
	d := digestKey(raw)
	return hex.EncodeToString(d[:])
}

// maskKey shows the type prefix and four characters, then masking characters.
func maskKey(raw string) string {
	const shown = len(PublicKeyPrefix) + 4
	if len(raw) < shown {
		return strings.Repeat("*", 12)
	}
	return raw[:shown] + strings.Repeat("*", 12)
}

// newSecret returns 32 random bytes as base64url, for client-emit and webhook secrets.
func newSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
