package main

import (
	"context"
	"errors"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/api/webhook"
	"github.com/relayhq/relay/store"
)

// The actors declare what they need from storage as function types; these
// adapt the store to them (store/ never imports actors/: the actors own no storage code).

func settingsLoader(st *store.Store, now func() time.Time) actors.SettingsLoader {
	return func(ctx context.Context, projectID string) (actors.Settings, error) {
		p, err := st.Project(ctx, projectID)
		if errors.Is(err, store.ErrNotFound) {
			return actors.Settings{}, actors.ErrProjectNotFound
		}
		if err != nil {
			return actors.Settings{}, err
		}
		s, err := st.Settings(ctx, projectID)
		if err != nil {
			return actors.Settings{}, err
		}
		revs, err := st.Revocations(ctx, projectID, now())
		if err != nil {
			return actors.Settings{}, err
		}
		out := actors.Settings{ClientEmitSecret: p.ClientEmitSecret, WebhookURL: s.WebhookURL, WebhookSecret: s.WebhookSecret,
			WebhookChannelEvents: s.WebhookChannelEvents, WebhookPresenceEvents: s.WebhookPresenceEvents,
			Authz: api.ProjectAuthz(p, now())}
		for _, r := range revs {
			out.Revocations = append(out.Revocations, actors.Revocation{Kind: r.Kind, Value: r.Value, RevokedAt: r.RevokedAt, ExpiresAt: r.ExpiresAt})
		}
		if s.ChannelRateLimit != nil {
			out.ChannelRateLimit = *s.ChannelRateLimit
		}
		out.HistoryRetention = time.Duration(s.HistoryRetentionSeconds) * time.Second
		return out, nil
	}
}

// historyStore adapts the store's channel history to the actors.
type historyStore struct{ st *store.Store }

func (h historyStore) AppendHistory(ctx context.Context, recs []actors.HistoryRecord) ([]int, error) {
	rows := make([]store.HistoryMessage, len(recs))
	for i, r := range recs {
		rows[i] = store.HistoryMessage{ProjectID: r.Project, Channel: r.Channel, Seq: int64(r.Seq), Message: string(r.Message), CreatedAt: r.At,
			PublishID: r.PublishID}
	}
	return h.st.AppendHistory(ctx, rows)
}

func (h historyStore) LastHistorySeq(ctx context.Context, project, channel string) (uint64, error) {
	return h.st.LastHistorySeq(ctx, project, channel)
}

func (h historyStore) HistorySeqsOf(ctx context.Context, project, channel string, publishIDs []string) (map[string]uint64, error) {
	return h.st.HistorySeqsOf(ctx, project, channel, publishIDs)
}

func (h historyStore) HistoryBefore(ctx context.Context, project, channel string, before, above uint64, limit int) ([]actors.HistoryRecord, error) {
	rows, err := h.st.HistoryBefore(ctx, project, channel, before, above, limit)
	out := make([]actors.HistoryRecord, len(rows))
	for i, r := range rows {
		out[i] = actors.HistoryRecord{Project: r.ProjectID, Channel: r.Channel, Seq: uint64(r.Seq), Message: []byte(r.Message), At: r.CreatedAt}
	}
	return out, err
}

// webhookSender turns the actors' webhook events into deliveries.
func webhookSender(d *webhook.Dispatcher) actors.WebhookSender {
	return func(url, secret string, ev actors.WebhookEvent) {
		e := webhook.Event{Event: ev.Kind, ProjectID: ev.ProjectID, ConnectionID: ev.ConnectionID,
			Channel: ev.Channel, ClientID: ev.ClientID, Timestamp: ev.At.UTC().Format("2006-01-02T15:04:05.000Z")}
		if ev.Status.Supplied {
			code, reason := ev.Status.Code, ev.Status.Reason
			e.DisconnectStatusCode, e.DisconnectReason = &code, &reason
		}
		d.Deliver(webhook.Delivery{URL: url, Secret: secret, Event: e})
	}
}
