package main

// relay-bench transport: the CPU one request and its answer cost between two
// processes, over the cluster's transport (protoactor-go's remote, gRPC
// streams underneath, as the relay configures it) and over a plain TCP
// connection with length-prefixed frames, paced as a cluster's emits are. A
// cluster emit whose channel another node owns makes one such round trip
// (relay-bench README › Performance of a cluster), so this is the floor under what it adds to a single
// node's emit. Both processes are this binary (transport-peer); nothing else
// is measured.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// none is the client's pacing alone, answered at once: the part of every
// figure that is not the transport's.
var transports = []string{"protoactor", "tcp", "none"}

// transportRun is what one client process measured.
type transportRun struct {
	RoundTrips int     `json:"round_trips"`
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"` // both processes
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
}

func (r transportRun) cpuPerRoundTrip() float64 { return r.CPUSeconds * 1e6 / float64(r.RoundTrips) }

func runTransport(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("transport", flag.ExitOnError)
	rate := fs.Int("rate", 1000, "round trips per second, one at a time")
	duration := fs.Duration("duration", 8*time.Second, "measured traffic of each run")
	warmup := fs.Duration("warmup", 2*time.Second, "traffic before each run's measure")
	rounds := fs.Int("rounds", 3, "runs of each transport, alternated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rate < 1 || *duration <= 0 || *rounds < 1 {
		return errors.New("want -rate ≥ 1, -duration > 0 and -rounds ≥ 1")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	runs := map[string][]transportRun{}
	for range *rounds {
		for _, t := range transports {
			r, err := measureTransport(ctx, self, t, *rate, *warmup, *duration)
			if err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
			runs[t] = append(runs[t], r)
		}
	}
	out := map[string]any{"scenario": "transport", "rate": *rate, "duration_s": duration.Seconds(), "runs": runs}
	median := map[string]float64{}
	var human []string
	for _, t := range transports {
		cpu := make([]float64, 0, len(runs[t]))
		for _, r := range runs[t] {
			cpu = append(cpu, r.cpuPerRoundTrip())
		}
		span, med := spanOf(cpu, func(v float64) string { return fmt.Sprintf("%.0f", v) })
		median[t] = med
		last := runs[t][len(runs[t])-1]
		human = append(human, fmt.Sprintf("%s %.0f µs CPU per round trip (%s; latency of the last run p50 %.0f µs, p99 %.0f µs)",
			t, med, span, last.P50us, last.P99us))
	}
	pa, tcp := median["protoactor"]-median["none"], median["tcp"]-median["none"]
	out["cpu_us_per_round_trip"] = median
	out["ratio_without_pacing"] = pa / tcp
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	fmt.Printf("transport at %d/s, medians of %d runs, both processes: %s; without the pacing, protoactor %.0f µs and tcp %.0f µs, %.1f×\n",
		*rate, *rounds, strings.Join(human, "; "), pa, tcp, pa/tcp)
	return nil
}

// measureTransport starts a server and a client process of transport t and
// returns what the client measured; both end before it returns.
func measureTransport(ctx context.Context, self, t string, rate int, warmup, d time.Duration) (transportRun, error) {
	var r transportRun
	serverAddr, err := freeAddr()
	if err != nil {
		return r, err
	}
	clientAddr, err := freeAddr()
	if err != nil {
		return r, err
	}
	server := exec.CommandContext(ctx, self, "transport-peer", "-t", t, "-addr", serverAddr)
	stdin, _ := server.StdinPipe() // the server also ends when this closes: with this process
	stdout, _ := server.StdoutPipe()
	server.Stderr = os.Stderr
	if err := server.Start(); err != nil {
		return r, err
	}
	defer func() { stdin.Close(); server.Process.Kill(); server.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		return r, fmt.Errorf("server: %q %v", line, err)
	}
	client := exec.CommandContext(ctx, self, "transport-peer", "-t", t, "-addr", serverAddr,
		"-client-addr", clientAddr, "-server-pid", strconv.Itoa(server.Process.Pid),
		"-rate", strconv.Itoa(rate), "-warmup", warmup.String(), "-duration", d.String())
	client.Stderr = os.Stderr
	out, err := client.Output()
	if err != nil {
		return r, fmt.Errorf("client: %w", err)
	}
	if err := json.Unmarshal(out, &r); err != nil || r.RoundTrips == 0 {
		return r, fmt.Errorf("client said %q (%v)", out, err)
	}
	return r, nil
}

// runTransportPeer is one end: with -server-pid the client, else the server
// (an echo, until its standard input closes).
func runTransportPeer(args []string) error {
	fs := flag.NewFlagSet("transport-peer", flag.ExitOnError)
	t := fs.String("t", "tcp", "protoactor, tcp or none")
	addr := fs.String("addr", "", "the server's loopback HOST:PORT")
	clientAddr := fs.String("client-addr", "", "the client's own HOST:PORT (protoactor's remote listens at both ends)")
	serverPID := fs.Int("server-pid", 0, "the server's process id: run as the client")
	rate := fs.Int("rate", 1000, "round trips per second")
	duration := fs.Duration("duration", 8*time.Second, "measured traffic")
	warmup := fs.Duration("warmup", 2*time.Second, "traffic before the measure")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *serverPID == 0 {
		if err := serveTransport(*t, *addr); err != nil {
			return err
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return nil
	}
	time.AfterFunc(*duration+time.Minute, func() { // a server that stopped answering
		fmt.Fprintln(os.Stderr, "transport-peer: no end after", *duration+time.Minute)
		os.Exit(1)
	})
	ask, err := dialTransport(*t, *addr, *clientAddr)
	if err != nil {
		return err
	}
	payload := make([]byte, 100) // about an emit's ask
	var lat latHist              // of the measured run
	pace := func(d time.Duration, lat *latHist) int {
		every := time.Second / time.Duration(*rate)
		n, next, end := 0, time.Now(), time.Now().Add(d)
		for now := time.Now(); now.Before(end); now = time.Now() {
			if now.Sub(next) > 50*time.Millisecond { // far behind: no burst to catch up
				next = now
			}
			time.Sleep(next.Sub(now))
			next = next.Add(every)
			sent := time.Now()
			binary.BigEndian.PutUint64(payload, uint64(n))
			if err := ask(payload); err != nil {
				return -1
			}
			lat.record(uint64(time.Since(sent).Microseconds()))
			n++
		}
		return n
	}
	if n := pace(*warmup, &latHist{}); n < 0 {
		return errors.New("no answer in the warm-up")
	}
	cpu0 := selfProc().CPUSeconds + procCPU(*serverPID)
	began := time.Now()
	n := pace(*duration, &lat)
	if n <= 0 {
		return errors.New("no answer")
	}
	r := transportRun{RoundTrips: n, Seconds: time.Since(began).Seconds(), CPUSeconds: selfProc().CPUSeconds + procCPU(*serverPID) - cpu0}
	var m mergedHist
	m.add(&lat)
	r.P50us, r.P99us = float64(m.quantile(.5)), float64(m.quantile(.99))
	return json.NewEncoder(os.Stdout).Encode(r)
}

func procCPU(pid int) float64 {
	st, _ := readProc(pid)
	return st.CPUSeconds
}

// The relay's remote settings that bear on a message's cost (actors/cluster_wire.go:
// its HTTP/2 windows and send queue; without TLS, about 3 % of a cluster emit's CPU).
func remoteConfig(addr string) *remote.Config {
	const window = 4 << 20
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	return remote.Configure(host, p,
		remote.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window)),
		remote.WithServerOptions(grpc.InitialWindowSize(window), grpc.InitialConnWindowSize(window)),
		remote.WithEndpointWriterQueueSize(1024))
}

func quietActorSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
}

func serveTransport(t, addr string) error {
	switch t {
	case "protoactor":
		sys := quietActorSystem()
		remote.NewRemote(sys, remoteConfig(addr)).Start()
		_, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
			if m, ok := ctx.Message().(*wrapperspb.BytesValue); ok {
				ctx.Respond(m)
			}
		}), "echo")
		return err
	case "none":
		return nil
	case "tcp":
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { // echo each frame as it comes
					defer c.Close()
					r := bufio.NewReader(c)
					for {
						f, err := readFrame(r)
						if err != nil || writeFrame(c, f) != nil {
							return
						}
					}
				}()
			}
		}()
		return nil
	}
	return fmt.Errorf("unknown transport %q", t)
}

// dialTransport returns ask, which sends one request and waits for its
// answer, delivered by a goroutine of the transport's as a real message is.
func dialTransport(t, addr, clientAddr string) (ask func([]byte) error, err error) {
	answers := make(chan []byte, 1)
	wait := func() error { <-answers; return nil } // a lost answer: the client's watchdog ends it
	switch t {
	case "none":
		return func([]byte) error { return nil }, nil
	case "protoactor":
		sys := quietActorSystem()
		remote.NewRemote(sys, remoteConfig(clientAddr)).Start()
		me, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
			if m, ok := ctx.Message().(*wrapperspb.BytesValue); ok {
				answers <- m.Value
			}
		}), "client")
		if err != nil {
			return nil, err
		}
		echo := actor.NewPID(addr, "echo")
		return func(p []byte) error {
			sys.Root.RequestWithCustomSender(echo, &wrapperspb.BytesValue{Value: p}, me)
			return wait()
		}, nil
	case "tcp":
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		go func() {
			r := bufio.NewReader(c)
			for {
				f, err := readFrame(r)
				if err != nil {
					return
				}
				answers <- f
			}
		}()
		return func(p []byte) error {
			if err := writeFrame(c, p); err != nil {
				return err
			}
			return wait()
		}, nil
	}
	return nil, fmt.Errorf("unknown transport %q", t)
}

func readFrame(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	f := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err := io.ReadFull(r, f)
	return f, err
}

func writeFrame(w io.Writer, p []byte) error {
	f := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(p)), uint32(len(p)))
	_, err := w.Write(append(f, p...))
	return err
}
