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

// RecordSink is a Sink that is also handed the records of each write, so that it need
// not read them back from the chain (audit/ocsf keeps them while it can and reads the
// chain for what it did not keep).
//
// The writer goroutine calls Records right before the Written of the same write, with
// that write's records in seq order (Seq, Prev and Hash set, the rest as appended) and
// end, the chain file's size in bytes after them. The slice is the sink's; the
// records' Extra maps are shared and must not be modified. Records must return at once.
type RecordSink interface {
	Sink
	Records(file string, recs []Record, end int64)
}
