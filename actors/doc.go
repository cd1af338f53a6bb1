// Package actors is the relay's actor system on protoactor-go: project, channel
// and connection actors, their messages, budgets, presence and replay. It never
// touches SQL or HTTP; loads go through the small interfaces of loaders.go, and
// sockets through the Sink handle the transport provides.
package actors
