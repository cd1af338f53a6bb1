package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"

	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/relayhq/relay/store/tempdb"
)

// What `relay-bench cluster` runs besides the relay: a throwaway etcd
// (actors/membership/tempetcd) and a throwaway PostgreSQL (store/tempdb), on
// loopback and a unix socket, in temporary directories named
// relay-bench-etcd-PID-… and relay-bench-pg-PID-… (PID is this process's).
// The tool stops both itself; etcd dies with the tool, and a PostgreSQL left
// behind by a relay-bench that was killed (pg_ctl detaches it) is stopped by
// the next run, found by its directory's name.

// freeAddr is 127.0.0.1:PORT with a port that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// pgServer is the throwaway PostgreSQL (store/tempdb), with a database per run.
type pgServer struct{ *tempdb.Server }

func startPostgres(ctx context.Context) (*pgServer, error) {
	s, err := tempdb.Start(ctx, "relay-bench-pg")
	if err != nil {
		return nil, err
	}
	return &pgServer{s}, nil
}

// createDB creates an empty database and returns its DATABASE_URL.
func (p *pgServer) createDB(ctx context.Context, name string) (string, error) {
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(p.URL("postgres"))))
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return p.URL(name), nil
}
