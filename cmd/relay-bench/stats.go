package main

import (
	"context"
	"flag"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// latHist is a fixed log-linear histogram of microseconds: exact below 64 µs,
// then 32 buckets per power of two (each at most 1/32 ≈ 3 % wide), up to
// 2^30 µs. Recording is an index computation and an increment: no allocation
// and no lock. Each goroutine owns one and they are merged at the end.
const (
	histLinear  = 64 // exact buckets 0..63 µs
	histSubBits = 5  // 32 buckets per octave above that
	histOctaves = 24 // 2^6 … 2^30 µs
	histBuckets = histLinear + histOctaves<<histSubBits
)

type latHist struct {
	counts [histBuckets]uint32
	n      uint64
	sum    uint64 // µs
	max    uint64 // µs
}

func histIndex(us uint64) int {
	if us < histLinear {
		return int(us)
	}
	shift := bits.Len64(us) - (histSubBits + 1) // ≥ 1
	top := us >> uint(shift)                    // in [32, 64)
	i := histLinear + (shift-1)<<histSubBits + int(top-1<<histSubBits)
	return min(i, histBuckets-1)
}

// histUpper is the highest value that lands in bucket i (HDR's "highest
// equivalent value"): quantiles are reported conservatively.
func histUpper(i int) uint64 {
	if i < histLinear {
		return uint64(i)
	}
	shift := uint((i-histLinear)>>histSubBits + 1)
	top := uint64((i-histLinear)&(1<<histSubBits-1) + 1<<histSubBits)
	return (top+1)<<shift - 1
}

func (h *latHist) record(us uint64) {
	h.counts[histIndex(us)]++
	h.n++
	h.sum += us
	if us > h.max {
		h.max = us
	}
}

// mergedHist is the sum of many latHists (64-bit counts).
type mergedHist struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	max    uint64
}

func (m *mergedHist) add(h *latHist) {
	for i, c := range h.counts {
		m.counts[i] += uint64(c)
	}
	m.n += h.n
	m.sum += h.sum
	m.max = max(m.max, h.max)
}

// quantile in µs; the exact maximum for q = 1.
func (m *mergedHist) quantile(q float64) uint64 {
	if m.n == 0 {
		return 0
	}
	if q >= 1 {
		return m.max
	}
	rank := uint64(q*float64(m.n) + 0.999999)
	rank = max(rank, 1)
	var seen uint64
	for i, c := range m.counts {
		seen += c
		if seen >= rank {
			return min(histUpper(i), m.max)
		}
	}
	return m.max
}

// latSummary is the JSON shape of a latency distribution, in milliseconds.
type latSummary struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

func (m *mergedHist) summary() latSummary {
	ms := func(us uint64) float64 { return float64(us) / 1000 }
	s := latSummary{Count: m.n, P50: ms(m.quantile(.5)), P90: ms(m.quantile(.9)), P99: ms(m.quantile(.99)),
		P999: ms(m.quantile(.999)), Max: ms(m.max)}
	if m.n > 0 {
		s.Mean = float64(m.sum) / float64(m.n) / 1000
	}
	return s
}

func (s latSummary) String() string {
	return fmt.Sprintf("p50 %s p99 %s p999 %s max %s", fmtMS(s.P50), fmtMS(s.P99), fmtMS(s.P999), fmtMS(s.Max))
}

func fmtMS(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("%.2fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}

// seqSet records the seqs one subscriber received on its channel: a bitset
// from the first seq seen (channel seqs start from the server's clock, so
// they are large but dense), plus the rare seqs below it.
type seqSet struct {
	started  bool
	base     uint64
	bits     []uint64
	below    []uint64 // seqs under base: they arrived after a later one
	last     uint64   // highest seen
	lo       uint64   // lowest seen
	unique   int64
	outOfOrd int64 // arrived after a higher seq
	dups     int64
	jumps    int64 // too far from the others (a counter reset); not recorded
}

// maxSeqJump bounds the bitset: a seq further than this from what came
// before (a channel whose counter was reset) is counted, not recorded.
const maxSeqJump = 1 << 20

func (s *seqSet) add(seq uint64) {
	if !s.started {
		s.started, s.base, s.last, s.lo = true, seq, seq, seq
	}
	if seq < s.base {
		if s.base-seq > maxSeqJump || len(s.below) >= 1024 {
			s.jumps++
			return
		}
		if slices.Contains(s.below, seq) {
			s.dups++
			return
		}
		s.below = append(s.below, seq)
		s.unique++
		s.outOfOrd++
		s.lo = min(s.lo, seq)
		return
	}
	off := seq - s.base
	if seq > s.last && seq-s.last > maxSeqJump {
		s.jumps++
		return
	}
	w := int(off >> 6)
	if w >= len(s.bits) {
		s.bits = slices.Grow(s.bits, w+1-len(s.bits))
		s.bits = s.bits[:cap(s.bits)]
	}
	bit := uint64(1) << (off & 63)
	if s.bits[w]&bit != 0 {
		s.dups++
		return
	}
	s.bits[w] |= bit
	s.unique++
	if seq < s.last {
		s.outOfOrd++
	} else {
		s.last = seq
	}
}

func (s *seqSet) has(seq uint64) bool {
	if !s.started {
		return false
	}
	if seq < s.base {
		return slices.Contains(s.below, seq)
	}
	off := seq - s.base
	w := int(off >> 6)
	return w < len(s.bits) && s.bits[w]&(1<<(off&63)) != 0
}

// missing counts the expected seqs (sorted) in [from, to] that s lacks, and
// how many it has.
func (s *seqSet) missing(expected []uint64, from, to uint64) (lost, matched int64) {
	i, _ := slices.BinarySearch(expected, from)
	for ; i < len(expected) && expected[i] <= to; i++ {
		if s.has(expected[i]) {
			matched++
		} else {
			lost++
		}
	}
	return lost, matched
}

// procSampler reads a process's /proc every 100 ms for its CPU time and its
// peak resident memory over a window.
type procSampler struct {
	pid    int
	mu     sync.Mutex
	first  procStats
	last   procStats
	peak   int64
	start  time.Time
	end    time.Time
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func startSampler(pid int) *procSampler {
	s := &procSampler{pid: pid, start: time.Now(), done: make(chan struct{})}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	st, err := readProc(pid)
	s.first, s.last, s.peak, s.err = st, st, st.RSSKiB, err
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *procSampler) sample() {
	st, err := readProc(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.last = st
	s.peak = max(s.peak, st.RSSKiB)
}

// serverUsage is the JSON shape of a sampled window.
type serverUsage struct {
	PID        int     `json:"pid"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Cores      float64 `json:"cores"` // CPU seconds per wall second
	RSSBefore  int64   `json:"rss_before_kib"`
	RSSPeak    int64   `json:"rss_peak_kib"`
	RSSAfter   int64   `json:"rss_after_kib"`
	Error      string  `json:"error,omitempty"`
}

// stop takes a last sample and returns the window's usage.
func (s *procSampler) stop() serverUsage {
	if s == nil {
		return serverUsage{}
	}
	s.cancel()
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	wall := time.Since(s.start).Seconds()
	u := serverUsage{PID: s.pid, CPUSeconds: s.last.CPUSeconds - s.first.CPUSeconds,
		RSSBefore: s.first.RSSKiB, RSSPeak: s.peak, RSSAfter: s.last.RSSKiB}
	u.Cores = u.CPUSeconds / wall
	if s.err != nil {
		u.Error = s.err.Error()
	}
	return u
}

func (u serverUsage) String() string {
	return fmt.Sprintf("server CPU %.2fs (%.2f cores), RSS %d→peak %d→%d KiB",
		u.CPUSeconds, u.Cores, u.RSSBefore, u.RSSPeak, u.RSSAfter)
}

// clientUsage is this process's CPU over a window, to show whether the tool
// itself saturated (on 2 cores, near 1 core for the tool means it competes
// with the server for the machine).
type clientUsage struct {
	CPUSeconds float64 `json:"cpu_seconds"`
	Cores      float64 `json:"cores"`
	RSSKiB     int64   `json:"rss_kib"`
	// The whole machine over the same window, from /proc/stat: what every
	// process used, so that a run disturbed by others shows it.
	MachineCPUSeconds float64 `json:"machine_cpu_seconds"`
	WallSeconds       float64 `json:"wall_seconds"`
}

type clientMeter struct {
	start   time.Time
	cpu     float64
	machine float64
}

func startClientMeter() clientMeter {
	return clientMeter{time.Now(), selfProc().CPUSeconds, machineBusy()}
}

func (m clientMeter) stop() clientUsage {
	st := selfProc()
	wall := time.Since(m.start).Seconds()
	u := clientUsage{CPUSeconds: st.CPUSeconds - m.cpu, RSSKiB: st.RSSKiB,
		MachineCPUSeconds: machineBusy() - m.machine, WallSeconds: wall}
	u.Cores = u.CPUSeconds / wall
	return u
}

// machineBusy is the CPU seconds every core has spent busy since boot.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	var busy float64
	for i, v := range f {
		if i == 0 || i == 4 || i == 5 || i > 8 {
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / clockTicks
}

// disturbance says when other processes used a noticeable share of the
// machine during the run (the server's figures then understate it).
func disturbance(server serverUsage, client clientUsage) (float64, string) {
	if client.MachineCPUSeconds == 0 || server.PID == 0 {
		return 0, ""
	}
	other := max(client.MachineCPUSeconds-client.CPUSeconds-server.CPUSeconds, 0)
	if other < 0.05*client.WallSeconds*float64(onlineCPUs()) {
		return other, ""
	}
	return other, fmt.Sprintf("other processes used %.1f CPU seconds during the run (%.2f cores): the figures are disturbed, run again on a quiet machine",
		other, other/client.WallSeconds)
}

// countFDs counts a process's open sockets (0 and an error if /proc is not readable).
func countSockets(pid int) (int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if t, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(t, "socket:") {
			n++
		}
	}
	return n, nil
}

// budgetAdvice warns when the server's budgets (read from an emit response)
// are below what a run will emit in its busiest minute.
func budgetAdvice(b budgets, perChannelPerMin, projectPerMin float64) string {
	var msgs []string
	if b.Channel > 0 && float64(b.Channel) < perChannelPerMin {
		msgs = append(msgs, fmt.Sprintf("EMIT_RATE_LIMIT_PER_MINUTE is %d but this run emits up to %.0f per channel per minute",
			b.Channel, perChannelPerMin))
	}
	if b.Project > 0 && float64(b.Project) < projectPerMin {
		msgs = append(msgs, fmt.Sprintf("PROJECT_RATE_LIMIT_PER_MINUTE is %d but this run emits up to %.0f per minute",
			b.Project, projectPerMin))
	}
	if len(msgs) == 0 {
		return ""
	}
	return strings.Join(msgs, "; ") + ": restart the relay with both raised (e.g. =100000000) or expect 429s (counted as refused, not as loss)"
}

func warn(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "relay-bench: warning: "+format+"\n", args...)
}

// cpuProfile registers -cpuprofile; start begins it (if asked) and returns the
// function that ends it.
func cpuProfile(fs *flag.FlagSet) func() (stop func(), err error) {
	path := fs.String("cpuprofile", "", "write the tool's own CPU profile here (to see what it spends)")
	return func() (func(), error) {
		if *path == "" {
			return func() {}, nil
		}
		f, err := os.Create(*path)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
		return func() { pprof.StopCPUProfile(); f.Close() }, nil
	}
}

// saturation says when the server and the tool together used nearly every
// core, so that a figure is the machine's limit rather than the server's.
// subscribers: the tool's receive side is elastic (with CPU to spare it
// reads sooner, in smaller batches, at a higher cost per message), so its
// share is not its minimum need.
func saturation(server serverUsage, client clientUsage, subscribers bool) string {
	cores := float64(onlineCPUs())
	used := server.Cores + client.Cores
	if server.PID == 0 || used < 0.9*cores {
		return ""
	}
	s := fmt.Sprintf("the machine was saturated (server %.2f + tool %.2f of %.0f cores): the figures are the machine's limit, not the server's alone",
		server.Cores, client.Cores, cores)
	if subscribers {
		s += "; the tool's subscribers read in smaller batches when CPU is to spare, so its share overstates its need"
	}
	return s
}

// onlineCPUs is the machine's core count (runtime.NumCPU is only those this
// process may run on, fewer under taskset).
func onlineCPUs() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if len(line) > 3 && strings.HasPrefix(line, "cpu") && line[3] >= '0' && line[3] <= '9' {
			n++
		}
	}
	return max(n, 1)
}

// usageNotes adds what every emitting scenario reports after its own
// figures: the tool's CPU, other processes' share of the machine, whether
// the machine saturated, whether the open-loop emitter fell behind, and a
// warning when the server's budgets refused emits.
func usageNotes(out map[string]any, human string, c *common, server serverUsage, client clientUsage,
	subscribers bool, et emitTotals, openLoop bool, advice string) string {
	human += fmt.Sprintf("; client CPU %.2fs (%.2f cores)", client.CPUSeconds, client.Cores)
	if other, note := disturbance(server, client); c.serverPID > 0 {
		out["other_processes_cpu_seconds"] = other
		if note != "" {
			out["disturbed"] = note
			human += "; " + note
		}
	}
	if sat := saturation(server, client, subscribers); sat != "" {
		out["saturated"] = sat
		human += "; " + sat
	}
	if openLoop {
		if behind := emitterBehind(et); behind != "" {
			out["emitter_behind"] = behind
			human += "; " + behind
		}
	}
	if advice != "" || et.Refused429 > 0 {
		if advice == "" {
			advice = "emits were refused with 429: raise EMIT_RATE_LIMIT_PER_MINUTE and PROJECT_RATE_LIMIT_PER_MINUTE on the relay"
		}
		out["warning"] = advice
	}
	return human
}
