package api

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"
)

// Raw keys after Post/Redirect/Get. Creating a project or rotating a key
// answers 303 to the project page, so that reloading that page neither
// creates nor rotates again; the raw keys, which Relay does not keep, ride
// along in a short-lived cookie that the project page's next GET opens,
// shows once and clears.
//
// The cookie is sealed with AES-256-GCM under a key derived (HKDF-SHA256)
// from the session cookie's value, which only this browser holds, salted with
// the session key, which only the servers hold: any node behind a load
// balancer can open it (no state on the node that issued it), no other
// browser or session can, and the browser itself cannot read it (HttpOnly)
// nor the network (Secure on https). It is bound to the project and user
// (additional data), expires after newKeysLifetime (Max-Age, and a time
// sealed inside, checked on the server's clock), is sent only to the
// project's pages (Path) and only from this site (SameSite=Strict).

const (
	newKeysCookie   = "relay_new_keys"
	newKeysLifetime = 2 * time.Minute
)

// sealedKeys is what the cookie carries.
type sealedKeys struct {
	Keys    []newKey `json:"k"`
	Notice  string   `json:"n"` // the notice shown with them
	Expires int64    `json:"e"` // Unix seconds
}

// newKeysAEAD is the cipher for one session cookie's value.
func (d dashboard) newKeysAEAD(session string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(session), d.sessions.key, "relay dashboard new keys", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// newKeysAD binds a sealed cookie to its project and user.
func newKeysAD(projectID string, v *viewer) []byte {
	return []byte("project\x00" + projectID + "\x00user\x00" + v.user.ID)
}

func newKeysPath(projectID string) string { return "/projects/" + projectID }

// showKeysNext redirects to the project page (303), which shows keys with
// notice once: the Post/Redirect/Get answer of create and rotate.
func (d dashboard) showKeysNext(w http.ResponseWriter, r *http.Request, v *viewer, projectID, notice string, keys []newKey) {
	value, err := d.sealKeys(v, projectID, sealedKeys{Keys: keys, Notice: notice, Expires: d.now().Add(newKeysLifetime).Unix()})
	if err != nil {
		d.internal(w, r, v, "seal new keys", err)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: newKeysCookie, Value: value, Path: newKeysPath(projectID), MaxAge: int(newKeysLifetime / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: d.sessions.secureFor(r),
	})
	w.Header().Set("Cache-Control", "no-store")
	done(w, r, projectID, "keys-shown")
}

func (d dashboard) sealKeys(v *viewer, projectID string, sk sealedKeys) (string, error) {
	aead, err := d.newKeysAEAD(v.session)
	if err != nil {
		return "", err
	}
	plain, err := json.Marshal(sk)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, plain, newKeysAD(projectID, v))), nil
}

// takeKeys opens the request's sealed keys for projectID and clears the
// cookie: whatever it held is shown at most once. ok is false when there is
// none, or it does not open (another session, another project, tampered) or
// has expired.
func (d dashboard) takeKeys(w http.ResponseWriter, r *http.Request, v *viewer, projectID string) (sk sealedKeys, ok bool) {
	c, err := r.Cookie(newKeysCookie)
	if err != nil {
		return sealedKeys{}, false
	}
	http.SetCookie(w, &http.Cookie{
		Name: newKeysCookie, Value: "", Path: newKeysPath(projectID), MaxAge: -1, Expires: time.Unix(1, 0),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: d.sessions.secureFor(r),
	})
	sealed, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return sealedKeys{}, false
	}
	aead, err := d.newKeysAEAD(v.session)
	if err != nil || len(sealed) < aead.NonceSize() {
		return sealedKeys{}, false
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], newKeysAD(projectID, v))
	if err != nil || json.Unmarshal(plain, &sk) != nil || !d.now().Before(time.Unix(sk.Expires, 0)) || len(sk.Keys) == 0 {
		return sealedKeys{}, false
	}
	return sk, true
}
