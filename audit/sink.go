package audit

// Sink receives every record the writer has written, in seq order, for an export
// beside the chain (package audit/ocsf). The writer goroutine calls Written after each
// successful write(2) of a batch, before any fsync, so an export never runs ahead of
// the chain; Close once, from Writer.Close, after the last records.
//
// Written must return quickly and must not keep recs (the writer reuses the slice):
// it copies what it needs and does the work elsewhere. A Sink never slows or fails the
// chain; what it cannot export is its own business.
type Sink interface {
	// Written reports records just written to the chain file file (its base name, as
	// in Checkpoint.File): Seq, Prev and Hash are set.
	Written(file string, recs []Record)
	// Close flushes and stops the sink; the writer calls it once, after its last
	// Written.
	Close() error
}
