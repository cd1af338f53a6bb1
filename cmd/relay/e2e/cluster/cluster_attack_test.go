//go:build cluster

package cluster

// Attacks on a TLS cluster from outside it, black-box: a process that can
// reach a node's RELAY_CLUSTER_ADDR, or etcd, but holds no certificate of
// the cluster's CA (none at all, or one of another CA) replays what a
// member would send. Each is refused at the TLS handshake, no node goes
// down, and no tenant's data is read or changed. Run with
// `make test-cluster` (or -run '^TestClusterAttacksFromOutside').

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	protobuf "google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/proto/clusterpb"
)

// attackEnvelope is one message of a hostile batch: what, to which actor.
type attackEnvelope struct {
	target *actor.PID
	msg    protobuf.Message
}

// attackBatch is a well-formed batch of envelopes from sender, as a member's
// endpoint writer would send it.
func attackBatch(t *testing.T, sender *actor.PID, envs ...attackEnvelope) *remote.RemoteMessage {
	t.Helper()
	b := &remote.MessageBatch{Senders: []*actor.PID{sender}}
	for _, e := range envs {
		data, err := protobuf.Marshal(e.msg)
		if err != nil {
			t.Fatal(err)
		}
		name := string(protobuf.MessageName(e.msg))
		typeID := slices.Index(b.TypeNames, name)
		if typeID < 0 {
			typeID, b.TypeNames = len(b.TypeNames), append(b.TypeNames, name)
		}
		b.Targets = append(b.Targets, e.target)
		b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{MessageData: data, TypeId: int32(typeID),
			Target: int32(len(b.Targets) - 1), Sender: 1})
	}
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}
}

// attackStream dials addr with creds, opens Remoting/Receive and sends
// msgs, as a member would; it returns how the stream ended (nil: the node
// took everything and closed it normally).
func attackStream(addr string, creds credentials.TransportCredentials, msgs ...*remote.RemoteMessage) error {
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the stream is over: Recv says why
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

// handshakeVerdict completes a TLS handshake with addr as cfg's client and
// reads: a server that refuses the client's certificate answers with an
// alert (TLS 1.3 checks it after the client's side is done), one that takes
// it sends nothing the application sees, and the read times out.
func handshakeVerdict(addr string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	return err
}

// refusedAtHandshake tells whether err is a client's connection ended by
// the server's handshake: its alert, or, when the client had written
// already (gRPC's preface, an HTTP request), the kernel's end of the
// connection the server closed with that unread.
func refusedAtHandshake(err error, alert string) bool {
	return err != nil && (strings.Contains(err.Error(), alert) ||
		strings.Contains(err.Error(), "write: broken pipe") || strings.Contains(err.Error(), "connection reset by peer"))
}

// etcdPutGRPC puts key=value through etcd's gRPC KV service (what clientv3
// and protoactor's provider use), failing fast instead of retrying.
func etcdPutGRPC(endpoint string, cfg *tls.Config, key, value string) error {
	conn, err := grpc.Dial(strings.TrimPrefix(endpoint, "https://"), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = etcdserverpb.NewKVClient(conn).Put(ctx, &etcdserverpb.PutRequest{Key: []byte(key), Value: []byte(value)})
	return err
}

// etcdPutHTTP puts key=value through etcd's JSON gateway (/v3/kv/put).
func etcdPutHTTP(endpoint string, cfg *tls.Config, key, value string) error {
	body, _ := json.Marshal(map[string][]byte{"key": []byte(key), "value": []byte(value)})
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	res, err := hc.Post(endpoint+"/v3/kv/put", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return fmt.Errorf("etcd answered the put: %d %s", res.StatusCode, b)
}

// etcdClient is an etcd client with the cluster's own client certificate,
// closed when t ends.
func etcdClient(t *testing.T, e *relaytest.Etcd) *clientv3.Client {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(e.Cert, e.Key)
	if err != nil {
		t.Fatal(err)
	}
	roots := relaytest.CertPool(t, e.CA)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second,
		TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdMembers lists the member keys under prefix, read with the cluster's
// own etcd client certificate.
func etcdMembers(t *testing.T, e *relaytest.Etcd, prefix string) map[string]string {
	t.Helper()
	cli := etcdClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("etcd get %s: %v", prefix, err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		var n struct {
			Host string `json:"host"`
			Port int    `json:"port"`
		}
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			t.Fatalf("etcd %s: %v: %s", kv.Key, err, kv.Value)
		}
		out[string(kv.Key)] = net.JoinHostPort(n.Host, fmt.Sprint(n.Port))
	}
	return out
}

// attackCounters are the figures an accepted hostile message would move.
var attackCounters = []string{"relay_cluster_members", "relay_cluster_grains", "relay_cluster_grain_activations_total",
	"relay_cluster_broadcasts_received_total", "relay_cluster_broadcasts_sent_total", "relay_cluster_cross_node_messages_total",
	"relay_cluster_duplicates_dropped_total", "relay_cluster_owner_refusals_total", "relay_cluster_activation_refusals_total"}

func attackSnapshot(t *testing.T, nodes []*clusterNode) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, n := range nodes {
		m := relaytest.ScrapeMetrics(t, n.proc.Debug+"/metrics")
		for _, name := range attackCounters {
			out[n.name+" "+name] = m.Get(t, name, "")
		}
	}
	return out
}

func TestClusterAttacksFromOutside(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	began := time.Now()
	cl := startCluster(t, 10*time.Second, []string{"A", "B"})
	a, b := cl.nodes[0], cl.nodes[1]
	pids := map[*clusterNode]int{a: a.pid(), b: b.pid()}
	const memberPrefix = "/relay/relaytest//relaytest/" // protoactor's provider: base key, cluster name

	// The victim: a project with a subscriber of "room" on each node, and a
	// clientId u1 holding a client-emit token on B.
	owner := a.on(t).Signup("alice@example.com")
	p := owner.CreateProject("victim")
	const ch = "room"
	subs := []*relaytest.WS{a.on(t).Subscribed(t, p.PublicKey, ch), b.on(t).Subscribed(t, p.PublicKey, ch)}
	secret := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret")
	if secret == "" {
		t.Fatal("no client-emit secret")
	}
	tok, err := backend.MintClientEmitToken(backend.TokenOptions{Secret: secret, ProjectID: p.ID, Channel: "chat",
		ClientID: "u1", Types: []string{"t"}, TTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	u1 := b.on(t).PresenceSub(t, p.PublicKey, "chat", "u1")
	u1.Expect(syncFrame("chat"))
	u1.Send(relaytest.EmitFrame("chat", "t", "1", tok))
	u1.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")

	// A few emits through each node, each reaching both subscribers.
	var history []string // the message frames, in seq order
	var firstSeq, lastSeq int64
	emitRoom := func(via *clusterNode, payload string) {
		t.Helper()
		e := expectEmitted(t, via.on(t).Client().Emit(p.SecretKey, `{"channel":"room","payload":`+payload+`}`), ch)
		if e.delivered != 2 || e.subscriberCount != 2 {
			t.Fatalf("emit through %s: delivered %d, subscriberCount %d; want 2 and 2", via.name, e.delivered, e.subscriberCount)
		}
		msg := fmt.Sprintf(`{"channel":"room","payload":%s,"seq":%d}`, payload, e.seq)
		if lastSeq > 0 && e.seq != lastSeq+1 {
			t.Fatalf("seq %d after %d: another message was stamped in between", e.seq, lastSeq)
		}
		lastSeq = e.seq
		if firstSeq == 0 {
			firstSeq = e.seq
		}
		for _, s := range subs {
			s.Expect(msg)
		}
		history = append(history, msg)
	}
	for i, via := range []*clusterNode{a, b, a} {
		emitRoom(via, fmt.Sprintf(`{"before":%d}`, i))
	}
	roomCount := `{"channel":"room","subscriberCount":2,"presenceMemberCount":0}`
	for _, n := range cl.nodes {
		n.on(t).Client().BearerGet("/channels/room", p.SecretKey).Expect(t, http.StatusOK, roomCount)
	}
	var grainOn *clusterNode
	for _, n := range cl.nodes {
		if n.hostsGrain(t, p.ID+"/"+ch) {
			grainOn = n
		}
	}
	if grainOn == nil {
		t.Fatalf("no node hosts the grain of %s/%s", p.ID, ch)
	}
	members := etcdMembers(t, cl.etcd, memberPrefix)
	if len(members) != 2 {
		t.Fatalf("etcd members before the attacks: %v, want 2", members)
	}

	// Where the attacker would receive what a node sends it (replays, live
	// messages, answers): a node that took any of its messages would dial it.
	trap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer trap.Close()
	var trapped atomic.Int64
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			trapped.Add(1)
			c.Close()
		}
	}()
	attackerAddr := trap.Addr().String()
	self := &actor.PID{Address: attackerAddr, Id: "attacker"}

	// The two attackers. Each trusts the real CAs (CA certificates are no
	// secret), so that only the node's or etcd's check of the client refuses it.
	clusterCAs := relaytest.CertPool(t, filepath.Join(cl.ca, "ca.pem"))
	etcdCAs := relaytest.CertPool(t, cl.etcd.CA)
	otherCert := relaytest.NodeCert(t, relaytest.NewCA(t), "127.0.0.1:1") // a CA of the attacker's own
	tlsTo := func(roots *x509.CertPool, cert *tls.Certificate) *tls.Config {
		c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if cert != nil {
			// Always shown: Go's client would send none, the server naming
			// only the cluster CA as acceptable.
			c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return c
	}
	attackers := []struct {
		name        string
		remote      *tls.Config
		etcd        *tls.Config
		remoteAlert string // the alert the node ends the handshake with (Go's TLS)
		etcdAlert   string // etcd's
	}{
		{"no certificate", tlsTo(clusterCAs, nil), tlsTo(etcdCAs, nil), "remote error: tls: certificate required", "remote error: tls: bad certificate"},
		{"a certificate of another CA", tlsTo(clusterCAs, &otherCert), tlsTo(etcdCAs, &otherCert),
			"remote error: tls: unknown certificate authority", "remote error: tls: bad certificate"},
	}

	// The wire works: a peer with a certificate of the cluster CA connects,
	// so a refusal below is the certificate's, not a wrong address.
	t.Run("control: a peer of the cluster CA connects", func(t *testing.T) {
		for _, n := range cl.nodes {
			res, err := openStream(t, n.addr, peerCreds(t, cl.ca, cl.ca), &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{
				ConnectRequest: &remote.ConnectRequest{ConnectionType: &remote.ConnectRequest_ServerConnection{
					ServerConnection: &remote.ServerConnection{SystemId: "probe", Address: "127.0.0.1:1"}}}}})
			if err != nil || res.GetConnectResponse() == nil {
				t.Fatalf("%s: connect: %v %v", n.name, res, err)
			}
		}
	})
	before := attackSnapshot(t, cl.nodes)
	logged := map[*clusterNode]int{} // how much of each node's log was written before the attacks
	for _, n := range cl.nodes {
		logged[n] = len(n.proc.Logs.String())
	}

	grainPID := func(n *clusterNode) *actor.PID {
		// What an ActivationResponse would name: the placement actor's child.
		return &actor.PID{Address: n.addr, Id: "partition-activator/" + p.ID + "/" + ch + "$1"}
	}
	// toNode sends a control-plane change, as the member whose API made it would.
	toNode := func(m *clusterpb.Broadcast) func(n *clusterNode) []*remote.RemoteMessage {
		m.Id, m.Origin, m.ProjectId = "attacker-1", "attacker", p.ID
		return func(n *clusterNode) []*remote.RemoteMessage {
			return []*remote.RemoteMessage{attackBatch(t, self, attackEnvelope{&actor.PID{Address: n.addr, Id: nodeActorName}, m})}
		}
	}
	now := time.Now()
	remoteAttacks := []struct {
		name string
		msgs func(n *clusterNode) []*remote.RemoteMessage
	}{
		{"1 batch: target 7 of no targets", func(n *clusterNode) []*remote.RemoteMessage {
			return []*remote.RemoteMessage{{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
				TypeNames: []string{string(protobuf.MessageName(&clusterpb.Broadcast{}))}, Envelopes: []*remote.MessageEnvelope{{Target: 7}}}}}}
		}},
		{"1 batch: type 9 of no type names", func(n *clusterNode) []*remote.RemoteMessage {
			return []*remote.RemoteMessage{{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
				Targets:   []*actor.PID{{Address: n.addr, Id: nodeActorName}},
				Envelopes: []*remote.MessageEnvelope{{Target: 0, TypeId: 9}}}}}}
		}},
		{"2 ActivationRequest for the room, then ChannelJoin to its grain", func(n *clusterNode) []*remote.RemoteMessage {
			return []*remote.RemoteMessage{attackBatch(t, self,
				attackEnvelope{&actor.PID{Address: n.addr, Id: "partition-activator"}, &protocluster.ActivationRequest{
					ClusterIdentity: &protocluster.ClusterIdentity{Kind: channelKind, Identity: p.ID + "/" + ch}, RequestId: "attacker-1"}},
				attackEnvelope{grainPID(n), &clusterpb.ChannelJoin{Relay: &clusterpb.Ref{Address: attackerAddr, Id: "attacker-relay"},
					Sub: &clusterpb.Subscriber{Conn: 1}, HasSince: true, Since: 0}},
			)}
		}},
		{"3 ChannelPublish of a non-JSON payload to the grain", func(n *clusterNode) []*remote.RemoteMessage {
			return []*remote.RemoteMessage{attackBatch(t, self, attackEnvelope{grainPID(n), &clusterpb.ChannelPublish{
				Id: "attacker-publish-1", ReplyTo: &clusterpb.Ref{Address: attackerAddr, Id: "attacker"}, Payload: []byte("not JSON {"),
				AtUnixNano: now.UnixNano(), NotAfterUnixNano: now.Add(time.Hour).UnixNano(), ChannelLimit: 1000}})}
		}},
		{"4 Broadcast ClientEmitSecretChanged to relay-node", toNode(&clusterpb.Broadcast{Change: &clusterpb.Broadcast_ClientEmitSecretChanged{ClientEmitSecretChanged: &clusterpb.ClientEmitSecretChanged{Secret: "attacker-secret"}}})},
		{"4 Broadcast ProjectDeleted to relay-node", toNode(&clusterpb.Broadcast{Change: &clusterpb.Broadcast_ProjectDeleted{ProjectDeleted: &clusterpb.ProjectDeleted{}}})},
		{"4 Broadcast KeysRevoked to relay-node", toNode(&clusterpb.Broadcast{Change: &clusterpb.Broadcast_KeysRevoked{KeysRevoked: &clusterpb.KeysRevoked{}}})},
		{"4 Broadcast ClientDisconnect to relay-node", toNode(&clusterpb.Broadcast{Change: &clusterpb.Broadcast_ClientDisconnect{ClientDisconnect: &clusterpb.ClientDisconnect{ClientId: "u1"}}})},
	}
	fakeKey := memberPrefix + "attacker-member"
	fakeValue := fmt.Sprintf(`{"id":"attacker-member","name":"relaytest","host":"127.0.0.1","address":"127.0.0.1","port":%d,"kinds":[%q],"alive":true}`,
		trap.Addr().(*net.TCPAddr).Port, channelKind)

	for _, at := range attackers {
		t.Run(at.name, func(t *testing.T) {
			// What every attack below meets first: each node's handshake, and
			// etcd's, refuses this client with an alert.
			for _, n := range cl.nodes {
				if err := handshakeVerdict(n.addr, at.remote.Clone()); err == nil || !strings.Contains(err.Error(), at.remoteAlert) {
					t.Fatalf("%s's handshake: %v; want %q", n.name, err, at.remoteAlert)
				}
			}
			if err := handshakeVerdict(strings.TrimPrefix(cl.etcd.Endpoint, "https://"), at.etcd.Clone()); err == nil ||
				!strings.Contains(err.Error(), at.etcdAlert) {
				t.Fatalf("etcd's handshake: %v; want %q", err, at.etcdAlert)
			}
			for _, atk := range remoteAttacks {
				for _, n := range cl.nodes {
					t.Run(atk.name+" to "+n.name, func(t *testing.T) {
						// A connect request first, as a member's endpoint writer sends.
						msgs := append([]*remote.RemoteMessage{{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
							ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{
								SystemId: "attacker", Address: attackerAddr}}}}}}, atk.msgs(n)...)
						err := attackStream(n.addr, credentials.NewTLS(at.remote.Clone()), msgs...)
						if status.Code(err) != codes.Unavailable || !refusedAtHandshake(err, at.remoteAlert) {
							t.Fatalf("stream ended with %v; want Unavailable, the handshake refused (%q)", err, at.remoteAlert)
						}
					})
				}
			}
			t.Run("5 etcd put of a fake member (gRPC)", func(t *testing.T) {
				err := etcdPutGRPC(cl.etcd.Endpoint, at.etcd.Clone(), fakeKey, fakeValue)
				if status.Code(err) != codes.Unavailable || !refusedAtHandshake(err, at.etcdAlert) {
					t.Fatalf("put: %v; want Unavailable, the handshake refused (%q)", err, at.etcdAlert)
				}
			})
			t.Run("5 etcd put of a fake member (JSON gateway)", func(t *testing.T) {
				err := etcdPutHTTP(cl.etcd.Endpoint, at.etcd.Clone(), fakeKey, fakeValue)
				if !refusedAtHandshake(err, at.etcdAlert) {
					t.Fatalf("put: %v; want the handshake refused (%q)", err, at.etcdAlert)
				}
			})
		})
	}

	t.Run("after the attacks", func(t *testing.T) {
		after := attackSnapshot(t, cl.nodes)
		for _, k := range slices.Sorted(maps.Keys(before)) {
			if after[k] != before[k] {
				t.Errorf("%s: %v before the attacks, %v after", k, before[k], after[k])
			}
		}
		for _, n := range cl.nodes {
			select {
			case <-n.proc.Exited:
				t.Fatalf("%s exited:\n%s", n.name, n.proc.Logs)
			default:
			}
			if n.pid() != pids[n] {
				t.Fatalf("%s: pid %d, was %d", n.name, n.pid(), pids[n])
			}
			r, err := relaytest.Do(nil, "GET", n.proc.Base+"/readyz", "", nil)
			if err != nil || r.Status != http.StatusOK {
				t.Fatalf("%s /readyz: %d %v", n.name, r.Status, err)
			}
			// Nothing reached the remote's guard or a grain, not even a message to refuse.
			if logs := n.proc.Logs.String()[logged[n]:]; strings.Contains(logs, "refused a message from a cluster peer") ||
				strings.Contains(logs, "refused a cluster peer's message") {
				t.Errorf("%s refused a peer's message during the attacks: the handshake let it through:\n%s", n.name, logs)
			}
		}
		got := etcdMembers(t, cl.etcd, memberPrefix)
		keys := make([]string, 0, len(got))
		for k := range got {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(got) != 2 || got[keys[0]] != members[keys[0]] || got[keys[1]] != members[keys[1]] {
			t.Fatalf("etcd members after the attacks: %v; before: %v", got, members)
		}
		addrs := []string{got[keys[0]], got[keys[1]]}
		sort.Strings(addrs)
		want := []string{a.addr, b.addr}
		sort.Strings(want)
		if !slices.Equal(addrs, want) {
			t.Fatalf("etcd members at %v, the nodes are at %v", addrs, want)
		}
		for _, n := range cl.nodes {
			n.waitMembers(t, 2, 5*time.Second)
		}
		if !grainOn.hostsGrain(t, p.ID+"/"+ch) {
			t.Errorf("the room's grain left %s", grainOn.name)
		}
		// The tenant's data: the project, its subscribers, its history, its
		// client-emit secret and its clientId u1's socket, as they were.
		if r := owner.Do("GET", "/api/projects/"+p.ID, ""); r.Status != http.StatusOK {
			t.Fatalf("GET the project: %d %s", r.Status, r.Raw)
		}
		for _, n := range cl.nodes {
			hc := n.on(t).Client()
			hc.BearerGet("/channels/room", p.SecretKey).Expect(t, http.StatusOK, roomCount)
			hc.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", firstSeq-1), p.SecretKey).Expect(t, http.StatusOK,
				`{"channel":"room","messages":[`+strings.Join(history, ",")+`],"gap":false}`)
		}
		if got := owner.Do("PATCH", "/api/projects/"+p.ID+"/client-emit-secret", `{}`).Str("clientEmitSecret"); got != secret {
			t.Errorf("client-emit secret %q, was %q", got, secret)
		}
		u1.Send(relaytest.EmitFrame("chat", "t", "1", tok)) // refused had B taken the attacker's secret; closed had it taken ClientDisconnect
		u1.ExpectExcept(`{"action":"emit","channel":"chat","ok":true}`, "seq")
		for i, via := range []*clusterNode{a, b} {
			emitRoom(via, fmt.Sprintf(`{"after":%d}`, i))
		}
		for _, s := range append(subs, u1) {
			s.ExpectSilence(200 * time.Millisecond)
		}
		if n := trapped.Load(); n != 0 {
			t.Errorf("a node dialed the attacker's address %d times", n)
		}
	})
	t.Logf("attacks and checks took %v", time.Since(began).Round(100*time.Millisecond))
}
