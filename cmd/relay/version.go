package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo is what `relay version` prints and relay_build_info labels, from
// the build information the Go toolchain embeds in the binary.
type buildInfo struct {
	Version   string // module version: a tag when built with go install …@vX, "(devel)" from a checkout
	Revision  string // VCS revision, "unknown" when the build had no VCS information
	Time      string // VCS commit time (RFC 3339), "" when unknown
	Modified  bool   // the working tree had uncommitted changes
	GoVersion string
}

// readBuildInfo reads the binary's build information.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if bi.Main.Version != "" {
		b.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// printVersion is `relay version`.
func printVersion(w io.Writer, b buildInfo) error {
	modified := ""
	if b.Modified {
		modified = " (modified)"
	}
	t := b.Time
	if t == "" {
		t = "unknown"
	}
	_, err := fmt.Fprintf(w, "relay %s\nrevision: %s%s\ntime: %s\ngo: %s\n", b.Version, b.Revision, modified, t, b.GoVersion)
	return err
}

// buildInfoGauge is relay_build_info: 1, labelled with the build.
func buildInfoGauge(b buildInfo) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relay_build_info", Help: "Always 1; the labels name the build (relay version prints the same).",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
