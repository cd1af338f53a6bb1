package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestProjectScript runs api/examples/project.sh, the README's scripting
// example (curl and jq against the JSON API, nothing else), on both stores:
// `up` creates and configures a project, whose printed keys and secrets are
// the stored ones and work (an emit with the secret key; the webhook, budget,
// client emit and authorization set as asked); `down` deletes it; a refusal
// stops the script non-zero with the API's answer, and an `up` refused
// half-way deletes the project it created.
func TestProjectScript(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (.ci/run installs it): %v", tool, err)
		}
	}
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice := ts.Signup("alice@example.com")
		run := func(wantOK bool, env []string, args ...string) (string, string) {
			t.Helper()
			cmd := exec.Command("sh", append([]string{"../../api/examples/project.sh"}, args...)...)
			cmd.Env = append(os.Environ(), "RELAY_URL="+ts.Base, "RELAY_EMAIL=alice@example.com", "RELAY_PASSWORD=correct horse")
			cmd.Env = append(cmd.Env, env...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if (err == nil) != wantOK {
				t.Fatalf("project.sh %q: %v\nstdout: %s\nstderr: %s", args, err, stdout.String(), stderr.String())
			}
			return stdout.String(), stderr.String()
		}
		hook := "https://hooks.example.com/relay"
		out, _ := run(true, []string{"WEBHOOK_URL=" + hook, "CHANNEL_RATE_LIMIT=90"}, "up", "scripted")
		var up struct {
			Project                                              struct{ ID, Name string }
			Keys                                                 struct{ PublicKey, SecretKey string }
			Settings                                             json.RawMessage
			WebhookSecret, ClientEmitSecret, AuthorizationSecret string
		}
		if err := json.Unmarshal([]byte(out), &up); err != nil {
			t.Fatalf("up printed %q: %v", out, err)
		}
		id := up.Project.ID
		if up.Project.Name != "scripted" || !strings.HasPrefix(up.Keys.PublicKey, "pk_") || !strings.HasPrefix(up.Keys.SecretKey, "sk_") {
			t.Fatalf("up printed %s", out)
		}
		var settings any
		json.Unmarshal([]byte(cpSettings(id, hook, true, true, 90, true)), &settings)
		var printed any
		json.Unmarshal(up.Settings, &printed)
		if relaytest.Canonical(printed) != relaytest.Canonical(settings) {
			t.Fatalf("up printed the settings %s, want %s", relaytest.Canonical(printed), relaytest.Canonical(settings))
		}
		alice.Do("GET", "/api/projects/"+id+"/settings", "").Expect(t, http.StatusOK, cpSettings(id, hook, true, true, 90, true))
		stored, err := ts.app.store.Project(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		st := dashSettings(t, ts, id)
		if up.WebhookSecret == "" || up.WebhookSecret != st.WebhookSecret || up.ClientEmitSecret == "" || up.ClientEmitSecret != stored.ClientEmitSecret ||
			up.AuthorizationSecret == "" || up.AuthorizationSecret != stored.AuthSecret || !stored.Authorization {
			t.Fatalf("up printed secrets %q %q %q; stored %q %q %q (authorization %v)", up.WebhookSecret, up.ClientEmitSecret, up.AuthorizationSecret,
				st.WebhookSecret, stored.ClientEmitSecret, stored.AuthSecret, stored.Authorization)
		}
		emit := func(payload string) response {
			return ts.Client().Send("POST", "/emit", `{"channel":"room","payload":`+payload+`}`, "application/json",
				map[string]string{"Authorization": "Bearer " + up.Keys.SecretKey})
		}
		if r := emit(`{"n":1}`); r.Status != http.StatusOK || !strings.Contains(r.Raw, `"limit":90`) {
			t.Fatalf("emit with the printed secret key: %d %s", r.Status, r.Raw)
		}

		// A refusal: the API's answer on stderr, a non-zero exit.
		_, stderr := run(false, []string{"WEBHOOK_URL=ftp://nope"}, "up", "refused")
		if !strings.Contains(stderr, `refused: {"error":"invalid_webhook_url"}`) {
			t.Fatalf("a refused up said %q", stderr)
		}
		if r := alice.Do("GET", "/api/projects", ""); r.Status != http.StatusOK || strings.Contains(r.Raw, `"refused"`) || !strings.Contains(r.Raw, `"scripted"`) {
			t.Fatalf("after a refused up (its project deleted again): %d %s", r.Status, r.Raw)
		}
		_, stderr = run(false, []string{"RELAY_PASSWORD=wrong"}, "down", id)
		if !strings.Contains(stderr, `"error":"invalid_credentials"`) {
			t.Fatalf("a refused login said %q", stderr)
		}

		run(true, nil, "down", id)
		alice.Do("GET", "/api/projects/"+id, "").Expect(t, http.StatusNotFound, `{"error":"project_not_found"}`)
		if r := emit(`{"n":2}`); r.Status != http.StatusUnauthorized {
			t.Fatalf("emit after down: %d %s", r.Status, r.Raw)
		}
		_, stderr = run(false, nil, "down", id)
		if !strings.Contains(stderr, `{"error":"project_not_found"}`) {
			t.Fatalf("down twice said %q", stderr)
		}
	})
}
