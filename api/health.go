package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/relayhq/relay/actors"
)

// Delivery health (README.md › Delivery health): a project's live figures,
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

func (s *Server) health(projectID string) healthBody {
	h := s.actors.ProjectHealth(projectID)
	return healthBody{
		ProjectID: projectID, At: timestamp(s.now()), Connections: h.Connections,
		LastMinute: h.Minute.Figures(), LastHour: h.Hour.Figures(),
	}
}

func (c controlPlane) handleHealth(w http.ResponseWriter, r *http.Request) {
	if p, ok := c.owned(w, r); ok {
		writeJSON(w, http.StatusOK, c.health(p.ID))
	}
}

// healthView is the project page's section.
type healthView struct {
	Connections                            int
	Minute, Hour                           actors.HealthFigures
	MinuteP50, MinuteP99, HourP50, HourP99 string
	At                                     string
}

func (s *Server) healthView(projectID string) *healthView {
	b := s.health(projectID)
	return &healthView{
		Connections: b.Connections, Minute: b.LastMinute, Hour: b.LastHour,
		MinuteP50: showMs(b.LastMinute.P50Ms), MinuteP99: showMs(b.LastMinute.P99Ms),
		HourP50: showMs(b.LastHour.P50Ms), HourP99: showMs(b.LastHour.P99Ms),
		At: s.now().UTC().Format(time.TimeOnly),
	}
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
