package audit

import (
	"os"
	"path/filepath"
	"time"
)

// Retention bounds the log on disk (Config.Retention): the oldest finished files are
// deleted, whole and in order, while the log files together exceed MaxBytes or while
// the oldest one's last record is older than MaxAge. Only files sealed by a checkpoint
// are deleted, never the file being written, so Verify anchors what remains on the
// checkpoint of the last deleted file and reports the deleted ones as
// Report.RetainedFiles (expected), while a gap in the middle or a changed record still
// breaks the chain. checkpoints.jsonl is kept whole (one line per finished file).
type Retention struct {
	// MaxBytes is the most the log files may hold together, in bytes; 0 means no size
	// limit. The file being written counts but is never deleted, so the log may exceed
	// it by up to one file (Config.MaxFileBytes).
	MaxBytes int64 `yaml:"maxBytes"`
	// MaxAge deletes finished files whose last record is older than this (a Go
	// duration in YAML: "2160h"); 0 means no age limit.
	MaxAge time.Duration `yaml:"maxAge"`
}

// DefaultRetention is the retention airlock's servers use (stack.DefaultAuditConfig):
// 10 GiB and 90 days.
func DefaultRetention() Retention {
	return Retention{MaxBytes: 10 << 30, MaxAge: 90 * 24 * time.Hour}
}

// retainEvery is how often the writer applies retention (and re-reads the directory's
// size) besides at every rotation.
const retainEvery = time.Minute

// retain deletes the files that Retention allows to go and sets diskBytes to what
// remains; at most every retainEvery unless force. Run goroutine (and open) only.
func (w *Writer) retain(now time.Time, force bool) {
	if !force && now.Sub(w.retained) < retainEvery {
		return
	}
	w.retained = now
	files, err := logFiles(w.cfg.Dir)
	if err != nil {
		w.log.Warn("audit retention: list files", "err", err)
		return
	}
	sizes := make([]int64, len(files))
	var total int64
	for i, name := range files {
		if fi, err := os.Stat(filepath.Join(w.cfg.Dir, name)); err == nil {
			sizes[i] = fi.Size()
			total += sizes[i]
		}
	}
	defer func() { w.diskBytes.Store(total) }()
	ret := w.cfg.Retention
	if ret.MaxBytes <= 0 && ret.MaxAge <= 0 {
		return
	}
	cps, err := ReadCheckpoints(w.cfg.Dir)
	if err != nil {
		w.log.Warn("audit retention: read checkpoints", "err", err)
		return
	}
	sealed := make(map[string]Checkpoint, len(cps))
	for _, c := range cps {
		sealed[c.File] = c
	}
	removed := 0
	for i, name := range files {
		cp, ok := sealed[name]
		if name == w.name || !ok {
			break // only a prefix of sealed files goes, so what remains stays anchored
		}
		overSize := ret.MaxBytes > 0 && total > ret.MaxBytes
		overAge := ret.MaxAge > 0 && !cp.LastTime.IsZero() && now.Sub(cp.LastTime) > ret.MaxAge
		if !overSize && !overAge {
			break
		}
		if err := os.Remove(filepath.Join(w.cfg.Dir, name)); err != nil {
			w.log.Warn("audit retention: remove", "file", name, "err", err)
			break
		}
		total -= sizes[i]
		removed++
		w.metrics.retained.Inc()
		w.log.Info("audit file retained away", "file", name, "first_seq", cp.FirstSeq, "last_seq", cp.LastSeq,
			"last_time", cp.LastTime, "over_size", overSize, "over_age", overAge)
	}
	if removed > 0 {
		if err := syncDir(w.cfg.Dir); err != nil {
			w.log.Warn("audit retention: sync directory", "err", err)
		}
	}
}
