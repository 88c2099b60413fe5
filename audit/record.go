// Package audit is Airlock's tamper-evident decision log: one canonical JSON record per
// decision (DNS query, new connection, dropped packet, L7 request, gateway request,
// policy change), appended to hash-chained JSON Lines files.
//
// The record itself (Record, Source, the canonical bytes) lives in package
// audit/record, which depends on the standard library only; the names below are
// aliases of it.
package audit

import "github.com/airlockdev/airlock/audit/record"

// Record is one decision (record.Record).
type Record = record.Record

// Source names the component that made a decision (record.Source).
type Source = record.Source

// Sources (see record.SourceDNS and the others).
const (
	SourceDNS        = record.SourceDNS
	SourceBPF        = record.SourceBPF
	SourceL7         = record.SourceL7
	SourceGateway    = record.SourceGateway
	SourcePolicy     = record.SourcePolicy
	SourceIngress    = record.SourceIngress
	SourceCredential = record.SourceCredential
	SourceExecd      = record.SourceExecd
	SourceControl    = record.SourceControl
)

// Actions besides a policy verdict (see record.ActionLoss and record.ActionSuppressed).
const (
	ActionLoss       = record.ActionLoss
	ActionSuppressed = record.ActionSuppressed
)
