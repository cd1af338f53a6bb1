package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"time"
)

// project is what a scenario needs: a fresh project and its raw keys.
type project struct {
	ID        string
	PublicKey string
	SecretKey string
}

// apiCall is a signed-in JSON API call: method, path and body, answering
// the status and the decoded body.
type apiCall func(method, path string, body any) (int, map[string]any, error)

// provisionWith signs up (or logs in) and creates a project named name,
// through -provision-base if set, else the first node, and answers the
// signed-in API caller too.
func provisionWith(ctx context.Context, c *common, name string) (project, apiCall, error) {
	base := c.base
	if c.provisionBase != "" {
		base = c.provisionBase
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	call := func(method, path string, body any) (int, map[string]any, error) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer res.Body.Close()
		var out map[string]any
		json.NewDecoder(res.Body).Decode(&out)
		return res.StatusCode, out, nil
	}
	post := func(path string, body any) (int, map[string]any, error) { return call("POST", path, body) }
	creds := map[string]string{"email": c.email, "password": c.password}
	status, out, err := post("/api/auth/signup", creds)
	if err != nil {
		return project{}, nil, err
	}
	if status != http.StatusCreated {
		if status, out, err = post("/api/auth/login", creds); err != nil || status != http.StatusOK {
			return project{}, nil, fmt.Errorf("sign up or log in as %s: %d %v %v", c.email, status, out, err)
		}
	}
	status, out, err = post("/api/projects", map[string]string{"name": name})
	if err != nil || status != http.StatusCreated {
		return project{}, nil, fmt.Errorf("create project: %d %v %v", status, out, err)
	}
	keys, _ := out["keys"].(map[string]any)
	p, _ := out["project"].(map[string]any)
	pr := project{}
	pr.ID, _ = p["id"].(string)
	pr.PublicKey, _ = keys["publicKey"].(string)
	pr.SecretKey, _ = keys["secretKey"].(string)
	return pr, call, nil
}

// keepHistory is a project set-up that turns its channel history on for
// seconds (0: leaves it off).
func keepHistory(seconds int) func(apiCall, string) error {
	return func(api apiCall, id string) error {
		if seconds == 0 {
			return nil
		}
		status, out, err := api("PATCH", "/api/projects/"+id+"/settings", map[string]int{"historyRetentionSeconds": seconds})
		if err == nil && status != 200 {
			err = fmt.Errorf("set historyRetentionSeconds %d: %d %v", seconds, status, out)
		}
		return err
	}
}

// emitterFor provisions a project named name (through the first node) and
// its HTTP emitters (one per node), and reads the server's budgets with one
// preflight emit.
func emitterFor(ctx context.Context, c *common, name string, workers, payloadBytes int, setup ...func(apiCall, string) error) (project, *emitters, budgets, error) {
	p, api, err := provisionWith(ctx, c, name)
	if err != nil {
		return p, nil, budgets{}, err
	}
	for _, f := range setup { // settings before the first emit
		if err := f(api, p.ID); err != nil {
			return p, nil, budgets{}, err
		}
	}
	em := newEmitters(c.bases, p.SecretKey, workers, payloadBytes)
	b, err := em.nodes[0].preflight(ctx)
	if err != nil {
		em.closeIdle()
		return p, nil, b, err
	}
	return p, em, b, nil
}
