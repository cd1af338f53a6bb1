package api

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// GET /channels/{channel}/messages on a project whose channel history is on
// (README › Channel history), on one node or several: the store answers,
// paging forwards (since) and backwards (before), limit messages a page
// (1–1000, 100 when absent), oldest first, exactly as subscribers got them,
// with more: true when the page was cut at limit (ask again with since =
// the last seq, or before = the first). gap, with since: no message at or
// before since is stored (the sweeps delete the oldest first), so some
// after it may be missing; as a subscribe's since reads the store
// (actors.readStoredReplay). A project with history off gets the ring's
// answer, as SPEC.md says.

const (
	defaultHistoryLimit = 100
	maxHistoryLimit     = 1000
)

type historyPage struct {
	Channel  string            `json:"channel"`
	Messages []json.RawMessage `json:"messages"`
	Gap      bool              `json:"gap"`
	More     bool              `json:"more"`
}

// historyMessages answers a messages query from the store when the
// project keeps channel history; false when it does not (the ring
// answers). Its live project says whether it does; only when none has
// loaded its settings is the store asked (and a store that fails there
// leaves the answer to the ring, from memory).
func (s *Server) historyMessages(ctx context.Context, w http.ResponseWriter, r *http.Request, projectID, channel string, hasSince bool, since uint64) bool {
	if s.actors == nil {
		return false
	}
	on, known := s.actors.HistoryOn(ctx, projectID)
	if !known {
		st, err := s.store.Settings(ctx, projectID)
		on = err == nil && st.HistoryRetentionSeconds > 0
	}
	if !on {
		return false
	}
	q := r.URL.Query()
	limit := defaultHistoryLimit
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > maxHistoryLimit {
			writeError(w, proto.CodeInvalidQuery, "param", "limit")
			return true
		}
		limit = n
	}
	var before uint64
	hasBefore := q.Has("before")
	if hasBefore {
		var ok bool
		if before, ok = querySince(q.Get("before")); !ok {
			writeError(w, proto.CodeInvalidQuery, "param", "before")
			return true
		}
	}
	page, err := s.readHistory(ctx, projectID, channel, hasSince, since, hasBefore, before, limit)
	if err != nil {
		s.queryFailed(w, projectID, err)
		return true
	}
	writeJSON(w, http.StatusOK, page)
	return true
}

// readHistory is one page: with before, the newest limit messages below it
// (and above since, if given); else with since, the oldest limit above it;
// else the newest limit.
func (s *Server) readHistory(ctx context.Context, projectID, channel string, hasSince bool, since uint64, hasBefore bool, before uint64, limit int) (historyPage, error) {
	page := historyPage{Channel: channel, Messages: []json.RawMessage{}}
	above := uint64(0) // since's own row tells whether anything after it is gone
	if hasSince && since > 0 {
		above = since - 1
	}
	var rows []store.HistoryMessage
	var err error
	if hasBefore || !hasSince {
		if !hasBefore {
			before = 1 << 62
		}
		rows, err = s.store.HistoryBefore(ctx, projectID, channel, before, above, limit+2)
		if n := len(rows); n > 0 && hasSince && uint64(rows[n-1].Seq) == since {
			rows = rows[:n-1]
		} else if hasSince && len(rows) < limit+2 { // every row above since was read, and since's is not among them
			page.Gap = !s.storedBefore(ctx, projectID, channel, since)
		}
		if len(rows) > limit {
			rows, page.More = rows[:limit], true
		}
		slices.Reverse(rows)
	} else {
		rows, err = s.store.HistoryAfter(ctx, projectID, channel, above, limit+2)
		if len(rows) > 0 && since > 0 && uint64(rows[0].Seq) == since {
			rows = rows[1:]
		} else {
			page.Gap = !s.storedBefore(ctx, projectID, channel, since)
		}
		if len(rows) > limit {
			rows, page.More = rows[:limit], true
		}
	}
	if err != nil {
		return page, err
	}
	for _, m := range rows {
		page.Messages = append(page.Messages, json.RawMessage(m.Message))
	}
	return page, nil
}

// storedBefore: a message of the channel below seq since (above 0) is
// stored, so the sweeps, which delete the oldest first, took nothing after
// since. A store that cannot say answers false (a gap).
func (s *Server) storedBefore(ctx context.Context, projectID, channel string, since uint64) bool {
	if since == 0 {
		return false
	}
	rows, err := s.store.HistoryBefore(ctx, projectID, channel, since, 0, 1)
	return err == nil && len(rows) > 0
}
