//go:build cluster

package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// The cluster's own wire, against a real node's RELAY_CLUSTER_ADDR: only a
// peer with a certificate of the cluster CA opens a stream, and a batch that
// crashed protoactor's endpoint reader ends that stream, not the node.

// peerCreds is a client TLS config with a certificate of the CA in caDir
// (made with relay cert, as a node's), trusting clusterCA.
func peerCreds(t *testing.T, caDir, clusterCA string) credentials.TransportCredentials {
	t.Helper()
	pair := relaytest.NodeCert(t, caDir, "127.0.0.1:1")
	roots := relaytest.CertPool(t, filepath.Join(clusterCA, "ca.pem"))
	// Always shown (GetClientCertificate): Go's client sends one from Certificates
	// only if it chains to a CA the server names as acceptable.
	return credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }})
}

// openStream opens Remoting/Receive on addr, sends msg, and returns the
// first answer or how the stream ended.
func openStream(t *testing.T, addr string, creds credentials.TransportCredentials, msg *remote.RemoteMessage) (*remote.RemoteMessage, error) {
	t.Helper()
	conn, err := grpc.Dial(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := remote.NewRemotingClient(conn).Receive(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(msg); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return stream.Recv()
}

func checkRemoteWire(t *testing.T, cl *testCluster, n *clusterNode) {
	members := n.metric(t, "relay_cluster_members")
	connect := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{SystemId: "probe", Address: "127.0.0.1:1"}}}}}
	t.Run("a peer with a certificate of the cluster CA connects", func(t *testing.T) {
		res, err := openStream(t, n.addr, peerCreds(t, cl.ca, cl.ca), connect)
		if err != nil || res.GetConnectResponse() == nil {
			t.Fatalf("connect: %v %v", res, err)
		}
	})
	otherCA := relaytest.NewCA(t)
	for name, creds := range map[string]credentials.TransportCredentials{
		"plain gRPC": insecure.NewCredentials(),
		// It trusts the cluster's CA, so only the node's check of its certificate refuses it.
		"a certificate of another CA": peerCreds(t, otherCA, cl.ca),
	} {
		t.Run(name+" is refused", func(t *testing.T) {
			res, err := openStream(t, n.addr, creds, connect)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v, %v; want the connection refused (Unavailable)", res, err)
			}
		})
	}
	t.Run("a batch indexing past its tables ends its stream, not the node", func(t *testing.T) {
		bad := &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
			TypeNames: []string{"google.protobuf.StringValue"},
			Envelopes: []*remote.MessageEnvelope{{Target: 7}}, // of no targets at all
		}}}
		_, err := openStream(t, n.addr, peerCreds(t, cl.ca, cl.ca), bad)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("stream ended with %v, want InvalidArgument", err)
		}
		bad.GetMessageBatch().Targets = []*actor.PID{{Address: n.addr, Id: nodeActorName}}
		bad.GetMessageBatch().Envelopes[0] = &remote.MessageEnvelope{Target: 0, TypeId: 9}
		if _, err := openStream(t, n.addr, peerCreds(t, cl.ca, cl.ca), bad); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("stream ended with %v, want InvalidArgument", err)
		}
		select {
		case <-n.proc.Exited:
			t.Fatalf("the node exited:\n%s", n.proc.Logs)
		default:
		}
		relaytest.Eventually(t, 5*time.Second, func() bool {
			return strings.Contains(n.proc.Logs.String(), "refused a message from a cluster peer")
		}, "the node logs the refusal")
		if got := n.metric(t, "relay_cluster_members"); got != members {
			t.Fatalf("the node sees %v members after the hostile batches, %v before", got, members)
		}
	})
}
