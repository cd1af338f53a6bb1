package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/proto"
)

// A project's webhook signing secret, recent webhook deliveries and test
// events (api/README.md › Webhooks and usage): GET and POST
// /api/projects/{projectId}/webhook-secret, GET …/webhook-deliveries, POST
// …/webhook-test, and the project page's "Recent webhook deliveries" card
// with its "Send test event" button. The deliveries are the ones this
// node's sender made (webhook.Dispatcher keeps them in memory), newest first.

// webhookRoutes adds the JSON routes (controlPlane.routes calls it).
func (c controlPlane) webhookRoutes(mux *http.ServeMux) {
	auth := c.sessions.requireUser
	mux.Handle("/api/projects/{projectId}/webhook-secret", methods{
		http.MethodGet:  auth(c.handleWebhookSecret),
		http.MethodPost: auth(c.handleWebhookSecret),
	})
	mux.Handle("/api/projects/{projectId}/webhook-deliveries", methods{http.MethodGet: auth(c.handleWebhookDeliveries)})
	mux.Handle("/api/projects/{projectId}/webhook-test", methods{http.MethodPost: auth(c.handleWebhookTest)})
}

// handleWebhookSecret answers the signing secret: GET reads it, POST
// replaces it (a receiver checking the old one refuses what follows). A
// POST body is ignored.
func (c controlPlane) handleWebhookSecret(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	body, err := p.webhookSecretBody(r.Context(), r.Method == http.MethodPost)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// webhookSecretBody is {"webhookSecret"}, replaced first when regenerate.
func (p ownedProject) webhookSecretBody(ctx context.Context, regenerate bool) (map[string]string, error) {
	get := p.webhookSecret
	if regenerate {
		get = p.regenerateWebhookSecret
	}
	secret, err := get(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]string{"webhookSecret": secret}, nil
}

// deliveryBody is one delivery on the wire (api/openapi.yaml, WebhookDelivery).
type deliveryBody struct {
	ID            string  `json:"id"`
	Event         string  `json:"event"`
	CreatedAt     string  `json:"createdAt"`
	Status        string  `json:"status"`
	Attempts      int     `json:"attempts"`
	StatusCode    *int    `json:"statusCode"`
	LastError     *string `json:"lastError"`
	LastAttemptAt *string `json:"lastAttemptAt"`
	NextAttemptAt *string `json:"nextAttemptAt"`
}

func toDeliveryBody(r webhook.Record) deliveryBody {
	b := deliveryBody{ID: r.ID, Event: r.Event, CreatedAt: timestamp(r.CreatedAt), Status: r.Status, Attempts: r.Attempts}
	if r.StatusCode != 0 {
		code := r.StatusCode
		b.StatusCode = &code
	}
	if r.LastError != "" {
		msg := r.LastError
		b.LastError = &msg
	}
	b.LastAttemptAt, b.NextAttemptAt = optTime(r.LastAttemptAt), optTime(r.NextAttemptAt)
	return b
}

func optTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	return optTimestamp(&t)
}

// deliveries are projectID's recent deliveries ([] without a sender).
func (s *Server) deliveries(projectID string) []webhook.Record {
	if s.webhooks == nil {
		return []webhook.Record{}
	}
	return s.webhooks.Deliveries(projectID)
}

func (c controlPlane) handleWebhookDeliveries(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	out := []deliveryBody{}
	for _, rec := range c.deliveries(p.ID) {
		out = append(out, toDeliveryBody(rec))
	}
	writeJSON(w, http.StatusOK, map[string]any{"deliveries": out})
}

// sendTestEvent's refusals beside errNoWebhookURL.
var (
	errWebhookQueueFull    = &proto.Error{Code: proto.CodeWebhookQueueFull}
	errWebhooksUnavailable = &proto.Error{Code: proto.CodeUnavailable}
)

// sendTestEvent queues a "test" event to p's webhook URL, signed with its
// secret: the same queue, fair turns and retries as every other event.
func (p ownedProject) sendTestEvent(r *http.Request, s *Server) (webhook.Record, error) {
	st, err := s.store.Settings(r.Context(), p.ID)
	if err != nil {
		return webhook.Record{}, err
	}
	if st.WebhookURL == "" {
		return webhook.Record{}, errNoWebhookURL
	}
	if s.webhooks == nil {
		return webhook.Record{}, errWebhooksUnavailable
	}
	rec, err := s.webhooks.Test(p.ID, st.WebhookURL, st.WebhookSecret)
	switch {
	case errors.Is(err, webhook.ErrQueueFull):
		return rec, errWebhookQueueFull
	case errors.Is(err, webhook.ErrClosed):
		return rec, errWebhooksUnavailable // shutting down
	}
	return rec, err
}

// handleWebhookTest answers 202 with the test event's delivery as queued;
// its outcome shows in the deliveries. A body is ignored.
func (c controlPlane) handleWebhookTest(w http.ResponseWriter, r *http.Request) {
	p, ok := c.owned(w, r)
	if !ok {
		return
	}
	rec, err := p.sendTestEvent(r, c.Server)
	if err != nil {
		c.writeOpError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"delivery": toDeliveryBody(rec)})
}

// deliveryRow is one line of the project page's table.
type deliveryRow struct {
	ID, Event, Created, Status, Badge string
	Attempts                          int
	Answer                            string // the last HTTP status, "" if none
	LastError                         string
	Next                              string // the next attempt's time while retrying
}

var deliveryBadges = map[string]string{
	webhook.StatusDelivered: "ok", webhook.StatusPending: "warn", webhook.StatusRetrying: "warn",
	webhook.StatusFailed: "bad", webhook.StatusRefused: "bad", webhook.StatusDropped: "bad",
}

func (s *Server) deliveryRows(projectID string) []deliveryRow {
	var rows []deliveryRow
	for _, r := range s.deliveries(projectID) {
		row := deliveryRow{ID: r.ID, Event: r.Event, Created: showSeconds(r.CreatedAt), Status: r.Status,
			Badge: deliveryBadges[r.Status], Attempts: r.Attempts, LastError: r.LastError}
		if r.StatusCode != 0 {
			row.Answer = strconv.Itoa(r.StatusCode)
		}
		if !r.NextAttemptAt.IsZero() {
			row.Next = showSeconds(r.NextAttemptAt)
		}
		rows = append(rows, row)
	}
	return rows
}

// handleWebhookTestForm is the project page's "Send test event" button.
func (d dashboard) handleWebhookTestForm(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	if _, err := p.sendTestEvent(r, d.Server); err != nil {
		d.opFailed(w, r, v, p.Project, err, nil)
		return
	}
	done(w, r, p.ID, "webhook-test")
}

// WebhookSecret is the project's webhook signing secret, replaced first
// when regenerate is set, as GET and POST …/webhook-secret answer it.
func (a *Admin) WebhookSecret(ctx context.Context, projectID string, regenerate bool) (any, error) {
	p, err := a.project(ctx, projectID)
	if err != nil {
		return nil, err
	}
	return p.webhookSecretBody(ctx, regenerate)
}
