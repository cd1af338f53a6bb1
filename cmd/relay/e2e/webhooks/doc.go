// Package webhooks holds the end-to-end tests of the webhooks a relay sends
// (connect and disconnect; channel and presence events opted in; exact
// bodies and signatures; a receiver that is slow, down or on a private
// address; the recent deliveries and test events), set up through the
// settings API, against the relay binary on loopback, with the shared
// harness cmd/relay/internal/relaytest.
package webhooks
