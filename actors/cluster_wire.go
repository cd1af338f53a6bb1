package actors

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/relayhq/relay/proto/clusterpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// The cluster's own wire: the actor remote's gRPC server and dialer. Only a
// peer with a certificate of the cluster CA opens a stream (mutual TLS), and
// what a peer sends can fail, never crash the node: protoactor's endpoint
// reader indexes a batch's tables with the peer's numbers and panics on a
// bad one, in the gRPC stream's goroutine, which nothing recovers.

// maxRemoteMsg: gRPC refuses messages over 4 MiB by default, and protoactor
// batches many into one: a replay ring (up to 1 MiB) or a handed-off state must fit.
const maxRemoteMsg = 64 << 20

// remoteWindow: the actor remote's HTTP/2 flow-control windows, fixed. Left
// to gRPC, they grow with a bandwidth estimate that pings the peer on data
// received: at a few thousand small messages a second, a ping and its ack
// for nearly every message.
const remoteWindow = 4 << 20

// ErrNoClusterTLS is JoinCluster's answer to a config with neither TLS nor Insecure.
var ErrNoClusterTLS = errors.New("the actor remote needs TLS credentials (or Insecure, for loopback tests)")

// remoteOptions are the actor remote's settings besides its address.
func remoteOptions(cfg ClusterConfig, guard *remoteGuard) ([]remote.ConfigOption, error) {
	server := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxRemoteMsg), grpc.MaxSendMsgSize(maxRemoteMsg),
		grpc.ChainStreamInterceptor(guard.stream), grpc.ChainUnaryInterceptor(guard.unary),
		grpc.InitialWindowSize(remoteWindow), grpc.InitialConnWindowSize(remoteWindow)}
	// protoactor's default dial options are grpc.WithInsecure() alone, and
	// WithDialOptions replaces them: the transport credentials are all we set.
	var dial grpc.DialOption
	switch {
	case cfg.TLS != nil:
		server = append(server, grpc.Creds(credentials.NewTLS(cfg.TLS.ServerConfig())))
		dial = grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS.ClientConfig()))
	case cfg.Insecure:
		dial = grpc.WithTransportCredentials(insecure.NewCredentials())
	default:
		return nil, ErrNoClusterTLS
	}
	return []remote.ConfigOption{
		remote.WithServerOptions(server...),
		remote.WithDialOptions(dial, grpc.WithInitialWindowSize(remoteWindow), grpc.WithInitialConnWindowSize(remoteWindow)),
		remote.WithCallOptions(grpc.MaxCallRecvMsgSize(maxRemoteMsg), grpc.MaxCallSendMsgSize(maxRemoteMsg)),
	}, nil
}

// etcdTLS is cfg's etcd TLS, cloned: the etcd client and protoactor's
// provider each get a copy they may change.
func etcdTLS(cfg ClusterConfig) *tls.Config {
	if cfg.EtcdTLS == nil {
		return nil
	}
	return cfg.EtcdTLS.Clone()
}

// remoteGuard stands between gRPC and protoactor's endpoint reader: it
// refuses a batch whose indexes or types protoactor would trip on, and
// recovers whatever else panics in a peer's stream, ending that stream only.
type remoteGuard struct {
	self    func() string // this node's remote address: every target of a batch is here
	log     *slog.Logger
	logs    logLimit
	refused atomic.Int64 // batches refused and streams ended by a panic, for tests
}

// peerLogEvery bounds the log lines about what peers send: a peer that
// sends bad messages in a loop must not flood the log.
const peerLogEvery = time.Second

// logLimit lets a log line through at most once per peerLogEvery and counts
// those it held back meanwhile.
type logLimit struct {
	mu   sync.Mutex
	last time.Time
	held int
}

// allow: log now, and held lines were held back since the last one.
func (l *logLimit) allow() (held int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.last) >= peerLogEvery {
		held, l.last, l.held = l.held, now, 0
		return held, true
	}
	l.held++
	return 0, false
}

func newRemoteGuard(log *slog.Logger, as *actor.ActorSystem) *remoteGuard {
	return &remoteGuard{log: log, self: as.Address}
}

func (g *remoteGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			g.refuse(ss.Context(), info.FullMethod, fmt.Errorf("panic: %v", r))
			err = status.Error(codes.Internal, "the message could not be handled")
		}
	}()
	return handler(srv, &checkedStream{ServerStream: ss, g: g, method: info.FullMethod, cert: peerCert(ss.Context())})
}

// peerCert is the certificate a peer showed (nil without TLS: Insecure).
func peerCert(ctx context.Context) *x509.Certificate {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			return ti.State.PeerCertificates[0]
		}
	}
	return nil
}

// unary covers protoactor's other Remoting methods, which panic("implement me").
func (g *remoteGuard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			g.refuse(ctx, info.FullMethod, fmt.Errorf("panic: %v", r))
			resp, err = nil, status.Error(codes.Unimplemented, "not served")
		}
	}()
	return handler(ctx, req)
}

// refuse counts and logs (throttled) one refused batch or recovered panic.
func (g *remoteGuard) refuse(ctx context.Context, method string, err error) {
	from := "unknown"
	if p, ok := peer.FromContext(ctx); ok {
		from = p.Addr.String()
		if cert := peerCert(ctx); cert != nil {
			from += " (" + cert.Subject.CommonName + ")"
		}
	}
	g.refused.Add(1)
	if held, ok := g.logs.allow(); ok {
		g.log.Warn("refused a message from a cluster peer; its stream is ended", "peer", from, "method", method, "err", err,
			"suppressed_since_last", held)
	}
}

// checkedStream hands protoactor only batches it can index, whose senders
// are at an address the peer's certificate names: a member acts only for
// itself (the actors check that a Ref a message names is its sender's).
type checkedStream struct {
	grpc.ServerStream
	g      *remoteGuard
	method string
	cert   *x509.Certificate // nil: no TLS (Insecure), no identity to check
	named  map[string]bool   // sender addresses the certificate names, checked once
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	msg, ok := m.(*remote.RemoteMessage)
	if !ok {
		return nil
	}
	if b := msg.GetMessageBatch(); b != nil {
		err := checkBatch(b)
		if err == nil {
			err = s.checkIdentity(b)
		}
		if err != nil {
			s.g.refuse(s.Context(), s.method, err)
			return status.Error(codes.InvalidArgument, "bad message batch")
		}
	}
	return nil
}

// localAddress is protoactor's address of an actor spawned before its
// remote started: such a sender names no member (nothing can answer it),
// so it claims no identity; the actors refuse it where one is needed.
const localAddress = "nonhost"

// checkIdentity refuses a batch with a sender at an address the peer's
// certificate does not name, or a target on another node (which protoactor
// would forward, under this node's identity).
func (s *checkedStream) checkIdentity(b *remote.MessageBatch) error {
	if s.cert == nil {
		return nil
	}
	for _, p := range b.Targets {
		if p.Address != s.g.self() {
			return fmt.Errorf("target %.100q is not on this node", p.Address)
		}
	}
	for _, p := range b.Senders {
		if s.named[p.Address] || p.Address == localAddress {
			continue
		}
		host, _, err := net.SplitHostPort(p.Address)
		if err != nil || s.cert.VerifyHostname(host) != nil {
			return fmt.Errorf("sender address %.100q is not one the peer's certificate names", p.Address)
		}
		if s.named == nil {
			s.named = map[string]bool{}
		}
		if len(s.named) < 16 { // a node has one address; bounded all the same
			s.named[p.Address] = true
		}
	}
	return nil
}

// checkBatch checks what protoactor's endpoint reader takes on trust: every
// index into the batch's tables, that no PID in them is nil, and that every
// type name is a registered protobuf message (its proto serializer
// dereferences the lookup's nil otherwise). Serializer 0 (protobuf) is the
// only one protoactor's writer uses.
func checkBatch(b *remote.MessageBatch) error {
	for i, p := range b.Targets {
		if p == nil {
			return fmt.Errorf("target %d is empty", i)
		}
	}
	for i, p := range b.Senders {
		if p == nil {
			return fmt.Errorf("sender %d is empty", i)
		}
	}
	for _, name := range b.TypeNames {
		if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name)); err != nil {
			return fmt.Errorf("unknown message type %.100q", name)
		}
	}
	for i, e := range b.Envelopes {
		switch {
		case e.Target < 0 || int(e.Target) >= len(b.Targets):
			return fmt.Errorf("envelope %d: target %d of %d", i, e.Target, len(b.Targets))
		case e.Sender < 0 || int(e.Sender) > len(b.Senders): // 0 is no sender, n is Senders[n-1]
			return fmt.Errorf("envelope %d: sender %d of %d", i, e.Sender, len(b.Senders))
		case e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames):
			return fmt.Errorf("envelope %d: type %d of %d", i, e.TypeId, len(b.TypeNames))
		case e.SerializerId != 0:
			return fmt.Errorf("envelope %d: serializer %d", i, e.SerializerId)
		}
	}
	return nil
}

// refuseContent counts and logs (logLimit) a message from a peer whose
// content no member of this cluster sends: a payload that is not JSON, a
// channel name no edge accepts. The node carries on.
func (c *Cluster) refuseContent(what, value string) {
	c.badContent.Add(1)
	if held, ok := c.contentLogs.allow(); ok {
		c.log.Warn("refused a cluster peer's message", "what", what, "value", truncate(value, 64), "suppressed_since_last", held)
	}
}

// refsItsSender: a message that names a relay or a reply-to (a Ref) came
// from that Ref's node. The remote guard checked that a peer's sender
// address is one its certificate names, so a member cannot subscribe,
// register, publish or ask in another member's name (and have a tenant's
// messages sent there). Such a message without a sender is refused: ours
// are sent with one (Cluster.send). Other messages pass.
func (c *Cluster) refsItsSender(ctx actor.Context, msg any) bool {
	ref, named := refOf(msg)
	if !named {
		return true
	}
	if s := ctx.Sender(); s != nil && ref != nil && s.Address == ref.Address {
		return true
	}
	c.refuseContent("ref not at its sender's address", ref.GetAddress())
	return false
}

// refOf is the relay or reply-to a message names; named is false for a
// message that names none.
func refOf(msg any) (ref *clusterpb.Ref, named bool) {
	switch m := msg.(type) {
	case interface{ GetRelay() *clusterpb.Ref }:
		return m.GetRelay(), true
	case interface{ GetReplyTo() *clusterpb.Ref }:
		return m.GetReplyTo(), true
	}
	return nil, false
}

// sentByMember: the message (a connection count) came from the node of
// member id in the latest member list. One from a member not listed is
// dropped without a word: a node that has just joined hears from members
// before it has read the list.
func (c *Cluster) sentByMember(ctx actor.Context, id string) bool {
	ok, listed := c.memberAt(id, ctx.Sender())
	if !ok && (listed || ctx.Sender() == nil) {
		c.refuseContent("member id not at its sender's address", id)
	}
	return ok
}

// memberAt: member id is in the latest member list (listed), at sender's
// address (ok).
func (c *Cluster) memberAt(id string, sender *actor.PID) (ok, listed bool) {
	members := c.view.Load().members
	i := slices.IndexFunc(members, func(m Member) bool { return m.ID == id })
	return i >= 0 && sender != nil && members[i].Address == sender.Address, i >= 0
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
