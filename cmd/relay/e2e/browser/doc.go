// Package browser holds the end-to-end tests of what the relay serves to
// browsers: /client.js and its types, /demo, the dashboard's health page,
// CORS, and the browser client itself running in a real headless Chromium,
// against the relay binary on loopback, with the shared harness
// cmd/relay/internal/relaytest.
package browser
