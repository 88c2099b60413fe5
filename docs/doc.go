// Package docs holds Airlock's design and the protocol texts it implements, and keeps
// the repository's documents true.
//
// architecture.md is the design, written from the code: the components and the layout,
// the data flow, each plane, the decisions and why, the protocol sources, testing and the
// performance targets. spec/ holds the OpenSandbox specifications the code cites,
// vendored unchanged with their licence (spec/README.md).
//
// The package has no code. Its test walks every Markdown file and every Go file of the
// module and fails when a document or a comment cites a file, a folder or a section
// (#anchor) that does not exist, cites anything outside the repository, or when a
// README does not link to architecture.md. It needs no privileges and runs in a second:
//
//	go test ./docs/
package docs
