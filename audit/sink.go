package audit

// Sink is told of every write to the chain, for an export beside it (package
// audit/ocsf) that reads the records back from the chain files: the writer's only
// cost is a call per write(2), so an export never slows the chain.
//
// The writer goroutine calls Written after each successful write(2) of a batch (before
// any fsync; every line up to lastSeq is complete in file), and Close once, from
// Writer.Close, after its last Written. Written must return at once.
type Sink interface {
	// Written reports that the records up to lastSeq are in the chain file file (its
	// base name, as in Checkpoint.File).
	Written(file string, lastSeq uint64)
	// Close flushes and stops the sink.
	Close() error
}
