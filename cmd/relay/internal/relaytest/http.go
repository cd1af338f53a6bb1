package relaytest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

// Response is an answer read whole: status, headers, raw body and the JSON
// object it holds (nil when it is not one).
type Response struct {
	Status int
	Header http.Header
	Raw    string
	JSON   map[string]any
}

// Do sends method url with body ("" sends none) and header (nil for none) on
// hc (nil: http.DefaultClient) and reads the answer. It returns errors rather
// than failing a test, so it also serves off the test's goroutine.
func Do(hc *http.Client, method, url, body string, header http.Header) (Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return Response{}, err
	}
	for k, vs := range header {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	r := Response{Status: res.StatusCode, Header: res.Header, Raw: string(raw)}
	json.Unmarshal(raw, &r.JSON)
	return r, err
}
