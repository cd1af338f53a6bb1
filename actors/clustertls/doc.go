// Package clustertls makes and loads the certificates of the cluster's own
// wire: a cluster CA, node certificates it signs (`relay cert`), and the
// mutual-TLS configurations the actor remote serves and dials with. It
// knows files and X.509, nothing of actors or of the relay's traffic.
package clustertls
