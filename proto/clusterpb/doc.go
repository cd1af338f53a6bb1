// Package clusterpb holds the protobuf messages that cross between relay
// nodes (protoactor's remote drops anything else). It is generated from
// proto/cluster.proto by `make proto`; the generated code is committed.
package clusterpb
