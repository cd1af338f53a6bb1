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

// procSampler reads the relay's processes' /proc every 100 ms for their CPU
// time and peak resident memory over a window (one process, or every node of
// a cluster: summed, with each node apart), and the CPU of the processes the
// relay uses (etcd, PostgreSQL) at both ends of the window.
type procSampler struct {
	pids    []int
	helpers []int
	mu      sync.Mutex
	first   []procStats
	last    []procStats
	peak    []int64
	peakSum int64 // the highest sum of one sampling pass
	helper0 float64
	start   time.Time
	err     error
	cancel  context.CancelFunc
	done    chan struct{}
}

func startSampler(pids, helpers []int) *procSampler {
	s := &procSampler{pids: pids, helpers: helpers, start: time.Now(), done: make(chan struct{}),
		first: make([]procStats, len(pids)), last: make([]procStats, len(pids)), peak: make([]int64, len(pids))}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	for i, pid := range pids {
		st, err := readProc(pid)
		s.first[i], s.last[i], s.peak[i] = st, st, st.RSSKiB
		s.peakSum += st.RSSKiB
		if err != nil && s.err == nil {
			s.err = err
		}
	}
	s.helper0 = treeCPU(helpers)
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
	var sum int64
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, pid := range s.pids {
		st, err := readProc(pid)
		if err != nil {
			if s.err == nil {
				s.err = err
			}
			sum += s.last[i].RSSKiB
			continue
		}
		s.last[i] = st
		s.peak[i] = max(s.peak[i], st.RSSKiB)
		sum += st.RSSKiB
	}
	s.peakSum = max(s.peakSum, sum)
}

// serverUsage is the JSON shape of a sampled window: with several nodes,
// the sums over them, and Nodes each apart.
type serverUsage struct {
	PID        int           `json:"pid"` // the first node's
	CPUSeconds float64       `json:"cpu_seconds"`
	Cores      float64       `json:"cores"` // CPU seconds per wall second
	RSSBefore  int64         `json:"rss_before_kib"`
	RSSPeak    int64         `json:"rss_peak_kib"`
	RSSAfter   int64         `json:"rss_after_kib"`
	Nodes      []serverUsage `json:"nodes,omitempty"`
	// HelpersCPU is what -helper-pid's processes (etcd, PostgreSQL and
	// their children) used over the window: not the relay's, not others'.
	HelpersCPU float64 `json:"helpers_cpu_seconds,omitempty"`
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
	var u serverUsage
	for i, pid := range s.pids {
		n := serverUsage{PID: pid, CPUSeconds: s.last[i].CPUSeconds - s.first[i].CPUSeconds,
			RSSBefore: s.first[i].RSSKiB, RSSPeak: s.peak[i], RSSAfter: s.last[i].RSSKiB}
		n.Cores = n.CPUSeconds / wall
		if i == 0 {
			u.PID = pid
		}
		u.CPUSeconds += n.CPUSeconds
		u.RSSBefore += n.RSSBefore
		u.RSSAfter += n.RSSAfter
		if len(s.pids) > 1 {
			u.Nodes = append(u.Nodes, n)
		}
	}
	u.RSSPeak = s.peakSum
	u.Cores = u.CPUSeconds / wall
	if len(s.helpers) > 0 {
		u.HelpersCPU = max(treeCPU(s.helpers)-s.helper0, 0)
	}
	if s.err != nil {
		u.Error = s.err.Error()
	}
	return u
}

func (u serverUsage) String() string {
	s := fmt.Sprintf("server CPU %.2fs (%.2f cores), RSS %d→peak %d→%d KiB",
		u.CPUSeconds, u.Cores, u.RSSBefore, u.RSSPeak, u.RSSAfter)
	if len(u.Nodes) > 0 {
		s = fmt.Sprintf("%d nodes, ", len(u.Nodes)) + s + " (summed; CPU per node"
		for _, n := range u.Nodes {
			s += fmt.Sprintf(" %.2f", n.CPUSeconds)
		}
		s += "s)"
	}
	if u.HelpersCPU > 0 {
		s += fmt.Sprintf(", etcd and PostgreSQL %.2fs", u.HelpersCPU)
	}
	return s
}

// treeCPU is the CPU seconds of processes and their live children, and of
// the children they have reaped (a PostgreSQL backend that ended is counted
// in its postmaster's cutime once reaped).
func treeCPU(pids []int) float64 {
	if len(pids) == 0 {
		return 0
	}
	parents := map[int]bool{}
	var total float64
	for _, pid := range pids {
		if f := statFields(pid); f != nil {
			parents[pid] = true
			total += (atof(f[11]) + atof(f[12]) + atof(f[13]) + atof(f[14])) / clockTicks
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || parents[pid] {
			continue
		}
		if f := statFields(pid); f != nil {
			if ppid, _ := strconv.Atoi(f[1]); parents[ppid] {
				total += (atof(f[11]) + atof(f[12])) / clockTicks
			}
		}
	}
	return total
}

// statFields are /proc/PID/stat's fields after the command name (state is
// [0], ppid [1], utime [11], stime [12], cutime [13], cstime [14]).
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 > len(b) {
		return nil
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 15 {
		return nil
	}
	return f
}

func atof(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
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
	other := max(client.MachineCPUSeconds-client.CPUSeconds-server.CPUSeconds-server.HelpersCPU, 0)
	if other < 0.05*client.WallSeconds*float64(onlineCPUs()) {
		return other, ""
	}
	return other, fmt.Sprintf("other processes used %.1f CPU seconds during the run (%.2f cores): the figures are disturbed, run again on a quiet machine",
		other, other/client.WallSeconds)
}

// countSockets counts a process's open sockets (0 and an error if /proc is not readable).
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
	helpers := 0.0
	if client.WallSeconds > 0 {
		helpers = server.HelpersCPU / client.WallSeconds
	}
	used := server.Cores + client.Cores + helpers
	if server.PID == 0 || used < 0.9*cores {
		return ""
	}
	s := fmt.Sprintf("the machine was saturated (server %.2f + tool %.2f of %.0f cores): the figures are the machine's limit, not the server's alone",
		server.Cores, client.Cores, cores)
	if helpers > 0 {
		s = fmt.Sprintf("the machine was saturated (server %.2f + tool %.2f + etcd and PostgreSQL %.2f of %.0f cores): the figures are the machine's limit, not the server's alone",
			server.Cores, client.Cores, helpers, cores)
	}
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
	if other, note := disturbance(server, client); c.measured() {
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
