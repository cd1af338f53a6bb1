package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// newCredentialsRefusal is why a new account's email and password are
// refused, or "": the checks of signup before the allowlist, shared with
// `relay admin create-user`.
func newCredentialsRefusal(email, password string) proto.Code {
	switch {
	case email == "" || password == "":
		return proto.CodeEmailAndPasswordRequired
	case len([]rune(password)) < proto.MinPasswordLen:
		return proto.CodePasswordTooShort
	}
	return ""
}

// errEmailTaken refuses a new account whose email already has one.
var errEmailTaken = &proto.Error{Code: proto.CodeEmailAlreadyRegistered}

// createAccount stores a new user with its password hash, or refuses with
// errEmailTaken: the last step of signup, shared with `relay admin
// create-user`.
func createAccount(ctx context.Context, st *store.Store, email, hash string) (store.User, error) {
	u, err := st.CreateUser(ctx, email, hash)
	if errors.Is(err, store.ErrDuplicate) {
		return store.User{}, errEmailTaken
	}
	if err != nil {
		return store.User{}, fmt.Errorf("create user: %w", err)
	}
	return u, nil
}

// argon2id parameters: OWASP's 19 MiB, 2 passes, 1 lane. One login costs about
// 20 ms of one core here, so a burst of logins cannot exhaust memory.
const (
	argonTime    = 2
	argonMemory  = 19 * 1024
	argonThreads = 1
	argonKeyLen  = 32
)

// hashPassword returns a PHC-style argon2id string.
func hashPassword(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	enc := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemory, argonTime, argonThreads, enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// checkPassword compares in constant time. A malformed hash never matches.
func checkPassword(encoded, password string) bool {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return false
	}
	var m, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return false
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[4])
	want, err2 := enc.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(want) == 0 {
		return false
	}
	got := argon2.IDKey([]byte(password), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1
}

// dummyHash is checked against when a login names an unknown email, so that
// the answer takes as long as for a wrong password (no enumeration by timing).
var dummyHash, _ = hashPassword("relay-dummy-password")
