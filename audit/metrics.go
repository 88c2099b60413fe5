package audit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the writer's Prometheus series (namespace airlock, subsystem audit).
type metrics struct {
	records     prometheus.Counter
	bytes       prometheus.Counter
	lost        *prometheus.CounterVec
	afterClose  prometheus.Counter
	writeErrors prometheus.Counter
	rotations   prometheus.Counter
	tornTails   prometheus.Counter
	fsync       prometheus.Histogram
	suppressed  *prometheus.CounterVec
	retained    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, queueLen func() float64, diskBytes func() int64) (*metrics, error) {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "airlock", Subsystem: "audit", Name: name, Help: help}
	}
	m := &metrics{
		records:     prometheus.NewCounter(opts("records_total", "Records written to the audit log, loss records included.")),
		bytes:       prometheus.NewCounter(opts("bytes_total", "Bytes written to the audit log.")),
		lost:        prometheus.NewCounterVec(opts("lost_total", "Records dropped because the queue was full (each loss is also written as a loss record)."), []string{"source"}),
		afterClose:  prometheus.NewCounter(opts("appended_after_close_total", "Records appended after Close (counted as lost).")),
		writeErrors: prometheus.NewCounter(opts("write_errors_total", "Failed writes and fsyncs.")),
		rotations:   prometheus.NewCounter(opts("rotations_total", "Log files finished with a checkpoint.")),
		tornTails:   prometheus.NewCounter(opts("torn_tails_total", "Torn last lines cut off when opening the log after a crash.")),
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "airlock", Subsystem: "audit", Name: "fsync_duration_seconds",
			Help: "Time per fsync of the audit log.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9)}),
		suppressed: prometheus.NewCounterVec(opts("suppressed_total", "Records not written because their sandbox or client was over its rate limit (counted in suppressed records)."), []string{"source"}),
		retained:   prometheus.NewCounter(opts("retained_files_total", "Finished log files deleted by retention.")),
	}
	if reg == nil {
		return m, nil
	}
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "airlock", Subsystem: "audit", Name: "queue_length",
		Help: "Records waiting to be written."}, queueLen)
	disk := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "airlock", Subsystem: "audit", Name: "disk_bytes",
		Help: "Bytes the audit log files take in the directory (checkpoints.jsonl not counted)."}, func() float64 { return float64(diskBytes()) })
	for _, c := range []prometheus.Collector{m.records, m.bytes, m.lost, m.afterClose, m.writeErrors, m.rotations, m.tornTails, m.fsync, m.suppressed, m.retained, queue, disk} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
