package actors

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	protobuf "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/relayhq/relay/actors/clustertls"
)

// A node's actor remote, started as JoinCluster starts it (remoteOptions)
// on a real loopback port, without etcd. One per test process: protoactor's
// remote.Start sets gRPC's global logger, which -race flags when remotes start
// beside each other's goroutines.
type wireNode struct {
	sys    *System
	addr   string // the remote's address, which local PIDs carry
	guard  *remoteGuard
	ca     clustertls.Pair
	conn   *grpc.ClientConn // a peer with a node certificate of the cluster CA
	probes atomic.Int64     // names of probe actors
}

var (
	wireOnce sync.Once
	wire     *wireNode
	wireErr  error
)

func startWireNode(t testing.TB) *wireNode {
	t.Helper()
	wireOnce.Do(func() { wire, wireErr = newWireNode() })
	if wireErr != nil {
		t.Fatal(wireErr)
	}
	return wire
}

func newWireNode() (*wireNode, error) {
	now := time.Now()
	ca, err := clustertls.NewCA("relay test CA", now)
	if err != nil {
		return nil, err
	}
	creds, err := testCredentials(ca, now)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := &wireNode{ca: ca}
	n.sys = NewSystem(Config{EmitRatePerMinute: 600, ProjectRatePerMinute: 6000, Logger: log,
		LoadSettings: func(context.Context, string) (Settings, error) { return Settings{}, nil }})
	n.guard = newRemoteGuard(log, n.sys.as)
	opts, err := remoteOptions(ClusterConfig{TLS: creds}, n.guard)
	if err != nil {
		return nil, err
	}
	remote.NewRemote(n.sys.as, remote.Configure("127.0.0.1", 0, opts...)).Start()
	n.addr = n.sys.as.Address()
	n.conn, err = grpc.Dial(n.addr, grpc.WithTransportCredentials(credentials.NewTLS(creds.ClientConfig())))
	return n, err
}

// testCredentials makes a node certificate for 127.0.0.1 signed by ca.
func testCredentials(ca clustertls.Pair, now time.Time) (*clustertls.Credentials, error) {
	node, err := clustertls.NewNode(ca, []string{"127.0.0.1"}, now)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(node.CertPEM, node.KeyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	return &clustertls.Credentials{CAs: pool, Cert: cert}, nil
}

// probe spawns an actor that reports each string it receives.
func (n *wireNode) probe(t testing.TB) (*actor.PID, <-chan string) {
	t.Helper()
	got := make(chan string, 16)
	pid, err := n.sys.root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(*wrapperspb.StringValue); ok {
			got <- m.Value
		}
	}), fmt.Sprintf("wire-probe-%d", n.probes.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.sys.root.Stop(pid) })
	return pid, got
}

// batchTo is a well-formed batch of one string to pid.
func batchTo(t testing.TB, pid *actor.PID, s string) *remote.RemoteMessage {
	t.Helper()
	data, err := protobuf.Marshal(wrapperspb.String(s))
	if err != nil {
		t.Fatal(err)
	}
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{"google.protobuf.StringValue"},
		Targets:   []*actor.PID{pid},
		Envelopes: []*remote.MessageEnvelope{{MessageData: data, Target: 0, TypeId: 0}},
	}}}
}

// send opens a Remoting/Receive stream on conn, sends msgs, closes its side
// and returns how the stream ended: nil when the node closed it normally.
func send(conn *grpc.ClientConn, msgs ...*remote.RemoteMessage) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the node ended the stream: Recv says how
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// alive checks that the node still takes a peer's stream and delivers
// what it carries to a local actor.
func (n *wireNode) alive(t testing.TB) {
	t.Helper()
	pid, got := n.probe(t)
	if err := send(n.conn, batchTo(t, pid, "still here")); err != nil {
		t.Fatalf("a good batch after the hostile one: %v", err)
	}
	select {
	case s := <-got:
		if s != "still here" {
			t.Fatalf("probe got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a good batch after the hostile one was not delivered within 5 s")
	}
}

// A peer whose certificate is not of the cluster CA, or that has none,
// cannot open a stream: nothing it sends reaches an actor.
func TestRemoteRefusesPeerWithoutClusterCert(t *testing.T) {
	n := startWireNode(t)
	now := time.Now()
	other, err := clustertls.NewCA("another CA", now)
	if err != nil {
		t.Fatal(err)
	}
	otherCreds, err := testCredentials(other, now)
	if err != nil {
		t.Fatal(err)
	}
	trustsOurCA := x509.NewCertPool()
	trustsOurCA.AppendCertsFromPEM(n.ca.CertPEM)
	peers := map[string]grpc.DialOption{
		"plain gRPC":                       grpc.WithTransportCredentials(insecure.NewCredentials()),
		"TLS without a client certificate": grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: trustsOurCA, MinVersion: tls.VersionTLS13})),
		// It trusts our CA, so only the node's check of its certificate refuses it.
		// GetClientCertificate, not Certificates: Go's client sends a certificate
		// from Certificates only if it chains to a CA the server names as acceptable.
		"a certificate of another CA": grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: trustsOurCA, MinVersion: tls.VersionTLS13,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &otherCreds.Cert, nil }})),
	}
	for name, creds := range peers {
		t.Run(name, func(t *testing.T) {
			conn, err := grpc.Dial(n.addr, creds)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			pid, got := n.probe(t)
			err = send(conn, batchTo(t, pid, "intruder"))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stream ended with %v, want Unavailable (no connection)", err)
			}
			select {
			case s := <-got:
				t.Fatalf("the refused peer's message reached the actor: %q", s)
			default:
			}
			n.alive(t)
		})
	}
	// And our node, dialing, refuses a peer that shows another CA's certificate.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", otherCreds.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	creds, err := testCredentials(n.ca, now)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", ln.Addr().String(), creds.ClientConfig())
	if err == nil {
		c.Close()
		t.Fatal("a node's dialer accepted a server certificate of another CA")
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("dial refused for another reason: %v", err)
	}
}

// Batches that index past their own tables, or name types that do not
// exist, panic in protoactor's endpoint reader. The guard refuses them: the
// peer's stream ends with an error and the node carries on.
func TestRemoteRefusesBadBatches(t *testing.T) {
	n := startWireNode(t)
	pid, _ := n.probe(t)
	good := func() *remote.MessageBatch { return batchTo(t, pid, "x").GetMessageBatch() }
	cases := map[string]func(b *remote.MessageBatch){
		"target past the targets":     func(b *remote.MessageBatch) { b.Targets = nil; b.Envelopes[0].Target = 7 },
		"negative target":             func(b *remote.MessageBatch) { b.Envelopes[0].Target = -1 },
		"type past the type names":    func(b *remote.MessageBatch) { b.TypeNames = nil; b.Envelopes[0].TypeId = 9 },
		"sender past the senders":     func(b *remote.MessageBatch) { b.Envelopes[0].Sender = 3 },
		"unknown type name":           func(b *remote.MessageBatch) { b.TypeNames[0] = "no.such.Type" },
		"serializer that is not ours": func(b *remote.MessageBatch) { b.Envelopes[0].SerializerId = 5 },
		// The peer's certificate names 127.0.0.1 only: it cannot act for another member.
		"sender the certificate does not name": func(b *remote.MessageBatch) {
			b.Senders, b.Envelopes[0].Sender = []*actor.PID{actor.NewPID("10.1.2.3:7000", "relay")}, 1
		},
		"target on another node": func(b *remote.MessageBatch) { b.Targets[0] = actor.NewPID("127.0.0.1:1", pid.Id) },
		// Passes the checks; protoactor dereferences the missing watchee.
		"Terminated without a watchee": func(b *remote.MessageBatch) {
			b.TypeNames[0] = "actor.Terminated"
			b.Envelopes[0].MessageData = nil
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			b := good()
			mutate(b)
			before := n.guard.refused.Load()
			err := send(n.conn, &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}})
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.Internal {
				t.Fatalf("stream ended with %v, want InvalidArgument or Internal", err)
			}
			if got := n.guard.refused.Load(); got != before+1 {
				t.Errorf("guard refused %d, want %d", got, before+1)
			}
			n.alive(t)
		})
	}
	// protoactor's unimplemented unary methods panic too.
	_, err := remote.NewRemotingClient(n.conn).ListProcesses(context.Background(), &remote.ListProcessesRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListProcesses: %v, want Unimplemented", err)
	}
	n.alive(t)
}

// A sender at an address the peer's certificate names (any port of its
// host), or at protoactor's address of an actor spawned before the remote
// started (which names no member), is delivered, with its sender.
func TestRemoteTakesSendersItsCertificateNames(t *testing.T) {
	n := startWireNode(t)
	for _, addr := range []string{"127.0.0.1:4242", localAddress} {
		got := make(chan *actor.PID, 1)
		pid := n.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			if _, ok := ctx.Message().(*wrapperspb.StringValue); ok {
				got <- ctx.Sender()
			}
		}))
		t.Cleanup(func() { n.sys.root.Stop(pid) })
		msg := batchTo(t, pid, "from a member")
		b := msg.GetMessageBatch()
		b.Senders, b.Envelopes[0].Sender = []*actor.PID{actor.NewPID(addr, "relay")}, 1
		if err := send(n.conn, msg); err != nil {
			t.Fatal(err)
		}
		select {
		case s := <-got:
			if s.GetAddress() != addr || s.GetId() != "relay" {
				t.Fatalf("delivered with sender %v, want %s/relay", s, addr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("from %s: not delivered within 5 s", addr)
		}
	}
}

// FuzzRemoteReceive sends whatever a peer with a valid certificate might:
// any RemoteMessage (connect requests, batches and envelopes of any shape)
// on a Remoting/Receive stream of a real node. The node must carry on: its
// actor system still delivers a good batch afterwards.
func FuzzRemoteReceive(f *testing.F) {
	n := startWireNode(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var msg remote.RemoteMessage
		if err := protobuf.Unmarshal(data, &msg); err != nil {
			return // not a message gRPC would decode either
		}
		// Seeds cannot know the node's port: "self" stands for it, so that
		// they reach this node's actors instead of being forwarded.
		if b := msg.GetMessageBatch(); b != nil {
			for _, p := range append(append([]*actor.PID(nil), b.Targets...), b.Senders...) {
				if p != nil && p.Address == "self" {
					p.Address = n.addr
				}
			}
		}
		_ = send(n.conn, &msg) // refused or not: the node must live
		n.alive(t)
	})
}
