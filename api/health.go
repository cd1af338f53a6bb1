package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/relayhq/relay/actors"
)

// Delivery health (api/README.md › Delivery health): a project's live figures,
// served by the nodes from memory (actors/health.go), as JSON for its owner
// and as a section of the dashboard's project page.

// healthBody is GET /api/projects/{projectId}/health.
type healthBody struct {
	ProjectID   string               `json:"projectId"`
	At          string               `json:"at"`
	Connections int                  `json:"connections"`
	LastMinute  actors.HealthFigures `json:"lastMinute"`
	LastHour    actors.HealthFigures `json:"lastHour"`
}

func (s *Server) health(projectID string, now time.Time) healthBody {
	h := s.actors.ProjectHealth(projectID)
	return healthBody{
		ProjectID: projectID, At: timestamp(now), Connections: h.Connections,
		LastMinute: h.Minute.Figures(), LastHour: h.Hour.Figures(),
	}
}

func (c controlPlane) handleHealth(w http.ResponseWriter, r *http.Request) {
	if p, ok := c.owned(w, r); ok {
		writeJSON(w, http.StatusOK, c.health(p.ID, c.now()))
	}
}

// healthView is the project page's section: the JSON route's figures, with
// the quantiles written out.
type healthView struct {
	Connections  int
	Minute, Hour healthWindowView
	At           string // time of day, UTC
}

type healthWindowView struct {
	actors.HealthFigures
	P50, P99 string
}

func (s *Server) healthView(projectID string) *healthView {
	now := s.now()
	b := s.health(projectID, now)
	window := func(f actors.HealthFigures) healthWindowView {
		return healthWindowView{HealthFigures: f, P50: showMs(f.P50Ms), P99: showMs(f.P99Ms)}
	}
	return &healthView{Connections: b.Connections, Minute: window(b.LastMinute), Hour: window(b.LastHour),
		At: now.UTC().Format(time.TimeOnly)}
}

// showMs shows a latency quantile, "–" with no sample.
func showMs(ms *float64) string {
	switch {
	case ms == nil:
		return "–"
	case *ms < 10:
		return strconv.FormatFloat(*ms, 'f', 2, 64) + " ms"
	default:
		return strconv.FormatFloat(*ms, 'f', 0, 64) + " ms"
	}
}
