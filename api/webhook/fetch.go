package webhook

import (
	"errors"
	"fmt"
	"io"
	"net/http"
)

// ErrTooLarge refuses an answer over a BoundedGetter's bound.
var ErrTooLarge = errors.New("answer over the size bound")

// BoundedGetter GETs with Client (NewClient's: the same refusal of
// private addresses as the webhooks) and refuses an answer over Max bytes.
// The channel-authorization JWKS of the projects are fetched through it:
// it is the HTTP client jwx's key cache takes.
type BoundedGetter struct {
	Client *http.Client
	Max    int64
}

// Get fetches u; a fragment, which the cache uses to tell its entries of
// one URL apart, is not sent.
func (g BoundedGetter) Get(u string) (*http.Response, error) {
	res, err := g.Client.Get(u)
	if err != nil {
		return nil, err
	}
	tooLarge := fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, g.Max)
	if res.ContentLength > g.Max {
		res.Body.Close()
		return nil, tooLarge
	}
	res.Body = &boundedBody{rc: res.Body, left: g.Max, err: tooLarge}
	return res, nil
}

// boundedBody fails a read past left bytes, so that io.ReadAll of a body
// over the bound fails rather than holds it.
type boundedBody struct {
	rc   io.ReadCloser
	left int64
	err  error // what a read past the bound answers
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if b.left -= int64(n); b.left < 0 {
		return 0, b.err
	}
	return n, err
}

func (b *boundedBody) Close() error { return b.rc.Close() }
