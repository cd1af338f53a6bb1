package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/relayhq/relay/actors/clustertls"
)

const certUsage = `usage: relay cert <command> [flags]

Certificates of the cluster's actor remote (cmd/relay/CLUSTER.md);
ECDSA P-256, no store or configuration needed. Existing files are never overwritten.

commands:
  ca    --out DIR                              a cluster CA: DIR/ca.pem, DIR/ca-key.pem (mode 0600)
  node  --ca DIR --addr HOST:PORT --out DIR    a node certificate for RELAY_CLUSTER_ADDR's host, signed
        [--host NAME[,NAME…]]                  by the CA in DIR: DIR/node.pem, DIR/node-key.pem (mode 0600);
                                               --host adds names or addresses it also answers to`

// File names relay cert writes and reads.
const (
	caCertFile   = "ca.pem"
	caKeyFile    = "ca-key.pem"
	nodeCertFile = "node.pem"
	nodeKeyFile  = "node-key.pem"
)

// runCert is `relay cert …`: exit status 2 (usageError) for a bad command
// line, 1 for a failure; it prints each file it wrote.
func runCert(args []string, out, logOut io.Writer, now time.Time) error {
	if len(args) == 0 {
		return usageError{certUsage}
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "help" {
		_, err := fmt.Fprintln(out, certUsage)
		return err
	}
	fs := flag.NewFlagSet("relay cert "+name, flag.ContinueOnError)
	fs.SetOutput(logOut)
	outDir := fs.String("out", "", "directory to write to (made if missing)")
	var caDir, addr, hosts *string
	switch name {
	case "ca":
	case "node":
		caDir = fs.String("ca", "", "directory of ca.pem and ca-key.pem")
		addr = fs.String("addr", "", "RELAY_CLUSTER_ADDR of the node (HOST:PORT)")
		hosts = fs.String("host", "", "more host names or addresses, comma-separated")
	default:
		return usageError{fmt.Sprintf("unknown cert command %q\n%s", name, certUsage)}
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{fmt.Sprintf("cert %s: %v", name, err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("cert %s: unexpected argument %q", name, fs.Arg(0))}
	}
	if *outDir == "" {
		return usageError{fmt.Sprintf("cert %s: --out is required\n%s", name, certUsage)}
	}
	var files []certFile
	switch name {
	case "ca":
		pair, err := clustertls.NewCA("Relay cluster CA", now)
		if err != nil {
			return err
		}
		files = []certFile{{caCertFile, pair.CertPEM, 0o644}, {caKeyFile, pair.KeyPEM, 0o600}}
	case "node":
		if *caDir == "" || *addr == "" {
			return usageError{fmt.Sprintf("cert node: --ca and --addr are required\n%s", certUsage)}
		}
		names, err := nodeHosts(*addr, *hosts)
		if err != nil {
			return usageError{"cert node: " + err.Error()}
		}
		ca, err := readCA(*caDir)
		if err != nil {
			return err
		}
		pair, err := clustertls.NewNode(ca, names, now)
		if err != nil {
			return fmt.Errorf("cert node: %w", err)
		}
		files = []certFile{{nodeCertFile, pair.CertPEM, 0o644}, {nodeKeyFile, pair.KeyPEM, 0o600}}
	}
	return writeNew(*outDir, files, out)
}

// nodeHosts are --addr's host and --host's names, each once.
func nodeHosts(addr, extra string) ([]string, error) {
	if !validHostPort(addr, true) {
		return nil, fmt.Errorf("--addr %q: want the node's RELAY_CLUSTER_ADDR, HOST:PORT (not 0.0.0.0)", addr)
	}
	host, _, _ := net.SplitHostPort(addr)
	names := []string{host}
	for _, h := range strings.Split(extra, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if strings.ContainsAny(h, " /:") && net.ParseIP(h) == nil {
			return nil, fmt.Errorf("--host %q: want a host name or an IP address", h)
		}
		if !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return names, nil
}

// readCA reads the CA relay cert ca wrote in dir.
func readCA(dir string) (clustertls.Pair, error) {
	var p clustertls.Pair
	var err error
	if p.CertPEM, err = os.ReadFile(filepath.Join(dir, caCertFile)); err != nil {
		return p, fmt.Errorf("cert node: the CA: %w", err)
	}
	if p.KeyPEM, err = os.ReadFile(filepath.Join(dir, caKeyFile)); err != nil {
		return p, fmt.Errorf("cert node: the CA's key: %w", err)
	}
	return p, nil
}

type certFile struct {
	name string
	data []byte
	mode fs.FileMode
}

// writeNew writes files into dir, none if any of them exists already: a CA
// or key overwritten by mistake would cut nodes off the cluster.
func writeNew(dir string, files []certFile, out io.Writer) error {
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(dir, f.name)); err == nil {
			return fmt.Errorf("%s exists: relay cert never overwrites a certificate or key (move it away first)", filepath.Join(dir, f.name))
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		// O_EXCL: a file made meanwhile is not overwritten either.
		w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return err
		}
		_, err = w.Write(f.data)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if _, err := fmt.Fprintln(out, "wrote", path); err != nil {
			return err
		}
	}
	return nil
}
