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
// The writer goroutine calls Records right before the Written of the same write. The
// batch is the sink's; its records' Extra maps are shared and must not be modified.
// Records must return at once: it runs on the writer's goroutine, which hands the batch
// over without encoding anything for it.
type RecordSink interface {
	Sink
	Records(b WrittenBatch)
	// Room is how many more records Records would keep now. The writer hands over no
	// batch larger than that (it copies no record the sink would drop); a sink's room
	// only grows between Room and the Records after it, as only Records fills it.
	Room() int
}

// WrittenBatch is one write's records, in seq order, as a RecordSink gets them.
type WrittenBatch struct {
	// File is the chain file they are in (its base name, as in Checkpoint.File) and
	// End its size in bytes after them.
	File string
	End  int64
	// Recs are the records as appended, Seq set; Prev and Hash are not set (the
	// writer does not hex-encode for the sink): Recs[i]'s hash is Hashes[i], and its
	// prev is Hashes[i-1], or Prev for Recs[0].
	Recs   []Record
	Hashes [][32]byte
	Prev   [32]byte
}
