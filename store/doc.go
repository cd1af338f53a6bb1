// Package store persists users, projects, API keys, settings, usage rows and
// client-emit token revocations, on PostgreSQL (pgdriver) or the embedded
// SQLite store (sqliteshim), with one set of versioned migrations for both.
// DATABASE_URL picks: "postgres://…" or "sqlite:PATH".
package store
