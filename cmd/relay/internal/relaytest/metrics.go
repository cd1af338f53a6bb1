package relaytest

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a /metrics page in the Prometheus text format, by
// family name.
type Metrics map[string]*dto.MetricFamily

// ScrapeMetrics GETs url (an operator listener's /metrics) and parses it; a
// status other than 200 or text that does not parse fails the test.
func ScrapeMetrics(t testing.TB, url string) Metrics {
	t.Helper()
	r, err := Do(nil, "GET", url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, r.Status, r.Raw)
	}
	m, err := ParseMetrics(r.Raw)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return m
}

// ParseMetrics parses the Prometheus text format.
func ParseMetrics(text string) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	return Metrics(fams), err
}

// Value is the sample name{labels}, labels written as in the exposition
// format (`cause="idle",code="1001"`, "" for none); a sample matches only
// with exactly these labels, in any order. For a histogram or a summary,
// name_count and name_sum name its count and sum. ok is false when the
// scrape has no such sample (or labels do not parse).
func (m Metrics) Value(name, labels string) (v float64, ok bool) {
	fam, field := m[name], ""
	if fam == nil {
		for _, suffix := range []string{"_count", "_sum"} {
			if base, cut := strings.CutSuffix(name, suffix); cut && m[base] != nil {
				fam, field = m[base], suffix
			}
		}
	}
	want, err := selector(labels)
	if fam == nil || err != nil {
		return 0, false
	}
	for _, s := range fam.GetMetric() {
		if labelKey(s.GetLabel()) != want {
			continue
		}
		switch {
		case field == "" && s.Counter != nil:
			return s.GetCounter().GetValue(), true
		case field == "" && s.Gauge != nil:
			return s.GetGauge().GetValue(), true
		case field == "" && s.Untyped != nil:
			return s.GetUntyped().GetValue(), true
		case field == "_count" && s.Histogram != nil:
			return float64(s.GetHistogram().GetSampleCount()), true
		case field == "_sum" && s.Histogram != nil:
			return s.GetHistogram().GetSampleSum(), true
		case field == "_count" && s.Summary != nil:
			return float64(s.GetSummary().GetSampleCount()), true
		case field == "_sum" && s.Summary != nil:
			return s.GetSummary().GetSampleSum(), true
		}
	}
	return 0, false
}

// Get is Value failing the test when there is no such sample.
func (m Metrics) Get(t testing.TB, name, labels string) float64 {
	t.Helper()
	v, ok := m.Value(name, labels)
	if !ok {
		t.Fatalf("no sample %s{%s} in /metrics", name, labels)
	}
	return v
}

// selector reads labels in the exposition format through the same parser,
// as the labels of a one-line scrape.
func selector(labels string) (string, error) {
	if labels == "" {
		return "", nil
	}
	m, err := ParseMetrics("x{" + labels + "} 0\n")
	if err != nil {
		return "", err
	}
	return labelKey(m["x"].GetMetric()[0].GetLabel()), nil
}

// labelKey renders label pairs in one order: a="1",b="2".
func labelKey(labels []*dto.LabelPair) string {
	kv := make([]string, 0, len(labels))
	for _, l := range labels {
		kv = append(kv, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}
