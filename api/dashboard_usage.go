package api

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/relayhq/relay/store"
)

// The usage page (api/README.md › Dashboard; GET …/usage answers the same rows
// as JSON: settings_api.go): the project's daily rows of the last usageDays
// UTC days as a table, and the same numbers as a server-rendered SVG chart.
// The chart uses presentation attributes and the stylesheet only: the CSP
// forbids inline styles.

const usageDays = 30

type usageView struct {
	ProjectID, ProjectName string
	From, To               string // first and last day shown, YYYY-MM-DD
	Rows                   []usageRow
	Total                  usageRow
	Chart                  *usageChart // nil without rows
}

type usageRow struct {
	Day                            string
	ConnectionsS, MessagesS, PeakS string
	// Delivery health (api/README.md › Delivery health).
	DeliveriesS, DroppedS, SlowS     string
	ChannelLimitedS, ProjectLimitedS string
	ClientLimitedS, P99S             string
}

func (d dashboard) handleUsage(w http.ResponseWriter, r *http.Request, v *viewer) {
	p, ok := d.project(w, r, v)
	if !ok {
		return
	}
	today := d.now().UTC().Truncate(24 * time.Hour)
	from := today.AddDate(0, 0, -(usageDays - 1))
	uv := &usageView{ProjectID: p.ID, ProjectName: p.Name, From: from.Format(time.DateOnly), To: today.Format(time.DateOnly)}
	shown, total, err := usageBetween(r.Context(), d.store, p.ID, uv.From, uv.To)
	if err != nil {
		d.internal(w, r, v, "load usage", err)
		return
	}
	// The table lists the newest day first; the chart runs left to right.
	for i := len(shown) - 1; i >= 0; i-- {
		uv.Rows = append(uv.Rows, newUsageRow(shown[i]))
	}
	uv.Total = newUsageRow(total)
	if len(shown) > 0 {
		uv.Chart = newUsageChart(from, shown)
	}
	pg := d.page(r, v, "Usage · "+p.Name)
	pg.Usage = uv
	d.render(w, r, v, http.StatusOK, "usage", pg)
}

// usageBetween is the project's daily rows from day from to day to
// (YYYY-MM-DD, both included), oldest first, and their total: the sums, and
// the max of the peak and of the p99. The usage page and GET …/usage both
// read them here.
func usageBetween(ctx context.Context, st *store.Store, projectID, from, to string) (rows []store.Usage, total store.Usage, err error) {
	all, err := st.Usage(ctx, projectID, from)
	if err != nil {
		return nil, total, err
	}
	for _, u := range all {
		if u.Day > to {
			continue // after the window (or a row from a node whose clock runs ahead)
		}
		rows = append(rows, u)
		total.Merge(u)
	}
	return rows, total, nil
}

func newUsageRow(u store.Usage) usageRow {
	var p99 *float64 // none that day
	if u.LatencyP99Ms > 0 {
		p99 = &u.LatencyP99Ms
	}
	return usageRow{Day: u.Day,
		ConnectionsS: groupDigits(u.ConnectionCount), MessagesS: groupDigits(u.MessageCount), PeakS: groupDigits(u.PeakConcurrentConnections),
		DeliveriesS: groupDigits(u.Deliveries), DroppedS: groupDigits(u.Dropped), SlowS: groupDigits(u.SlowConsumersClosed),
		ChannelLimitedS: groupDigits(u.ChannelRateLimited), ProjectLimitedS: groupDigits(u.ProjectRateLimited),
		ClientLimitedS: groupDigits(u.ClientEmitRateLimited), P99S: showMs(p99)}
}

// groupDigits prints n with thousands separators: 1234567 → 1,234,567.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := ""
	if n < 0 {
		neg, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return neg + s
}

// usageChart is the SVG: two panels sharing the day axis, messages on top
// and connections below, each with its own scale (messages usually outnumber
// connections by far). Coordinates are computed here; the template only
// prints them.
type usageChart struct {
	Width, Height int
	Panels        []chartPanel
	Days          []chartTick // x-axis labels
	AxisY         int         // where the day labels sit
}

type chartPanel struct {
	Title, Class, Color string
	TitleY              int
	Top, Bottom         int // plot area
	Left, Right         int
	Grid                []chartTick
	Bars                []chartBar
}

type chartTick struct {
	X, Y  string
	Label string
}

type chartBar struct {
	X, Y, W, H string
	Day        string
	Value      int64
	Title      string
}

const (
	chartWidth     = 720
	chartLeft      = 56 // room for the scale labels
	chartRight     = 12
	chartPlot      = 120 // height of one panel's plot area
	chartTitleGap  = 26
	chartPanelGap  = 30
	chartAxisSpace = 22
)

func newUsageChart(from time.Time, rows []store.Usage) *usageChart {
	c := &usageChart{Width: chartWidth}
	slot := float64(chartWidth-chartLeft-chartRight) / usageDays
	y := 0
	series := []struct {
		title, class, color, unit string
		value                     func(store.Usage) int64
	}{
		{"Messages per day", "bar-messages", "#2563eb", "messages", func(u store.Usage) int64 { return u.MessageCount }},
		{"Connections per day", "bar-connections", "#059669", "connections", func(u store.Usage) int64 { return u.ConnectionCount }},
	}
	for _, s := range series {
		p := chartPanel{Title: s.title, Class: s.class, Color: s.color, TitleY: y + 16, Left: chartLeft, Right: chartWidth - chartRight}
		p.Top = y + chartTitleGap
		p.Bottom = p.Top + chartPlot
		var top int64
		for _, u := range rows {
			top = max(top, s.value(u))
		}
		scale := niceCeil(top)
		for _, g := range []int64{0, scale / 2, scale} {
			if g == 0 && len(p.Grid) > 0 {
				continue // scale 1: no half line
			}
			gy := float64(p.Bottom) - float64(g)/float64(scale)*chartPlot
			p.Grid = append(p.Grid, chartTick{Y: fmtCoord(gy), Label: groupDigits(g)})
		}
		for _, u := range rows {
			day, err := time.Parse(time.DateOnly, u.Day)
			if err != nil {
				continue
			}
			i := int(day.Sub(from).Hours() / 24)
			if i < 0 || i >= usageDays {
				continue
			}
			val := s.value(u)
			h := float64(val) / float64(scale) * chartPlot
			p.Bars = append(p.Bars, chartBar{
				X: fmtCoord(float64(chartLeft) + float64(i)*slot + slot*0.15), W: fmtCoord(slot * 0.7),
				Y: fmtCoord(float64(p.Bottom) - h), H: fmtCoord(h),
				Day: u.Day, Value: val, Title: u.Day + ": " + groupDigits(val) + " " + s.unit,
			})
		}
		c.Panels = append(c.Panels, p)
		y = p.Bottom + chartPanelGap
	}
	last := c.Panels[len(c.Panels)-1].Bottom
	c.AxisY = last + 16
	for _, i := range []int{0, 7, 14, 21, usageDays - 1} {
		day := from.AddDate(0, 0, i)
		c.Days = append(c.Days, chartTick{X: fmtCoord(float64(chartLeft) + (float64(i)+0.5)*slot), Label: day.Format("Jan 2")})
	}
	c.Height = last + chartAxisSpace
	return c
}

// niceCeil rounds n up to a round number for the top of a scale: n itself
// up to 10, then 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten,
// so the tallest bar fills at least three quarters of its panel.
func niceCeil(n int64) int64 {
	if n <= 10 {
		return max(n, 1)
	}
	for p := int64(1); p <= math.MaxInt64/100; p *= 10 {
		for _, m := range []int64{10, 12, 15, 20, 25, 30, 40, 50, 60, 80} {
			if m*p >= n {
				return m * p
			}
		}
	}
	return n
}

func fmtCoord(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// showBytes prints a size in bytes with a binary unit: 512 B, 1.5 KiB, 20 MiB.
func showBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v, i = v/1024, i+1
	}
	prec := 1
	if v >= 10 {
		prec = 0
	}
	return strconv.FormatFloat(v, 'f', prec, 64) + " " + units[i:i+1] + "iB"
}
