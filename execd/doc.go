// Package execd is the execution daemon that runs inside every sandbox. It serves the
// OpenSandbox execd API (docs/spec/execd-api.yaml, plus the wire behaviours
// in docs/spec/NOTES.md) on port 44772:
//
//   - /ping, /metrics, /metrics/watch
//   - /command (foreground streams and background commands), /command/status/{id},
//     /command/{id}/logs (byte-offset cursor in EXECD-COMMANDS-TAIL-CURSOR)
//   - /session (persistent bash shells: cwd, variables and functions survive between runs)
//   - /files/... and /directories/... (info, upload, ranged download, search, replace,
//     permissions with owner/group names, move, delete, mkdir, list)
//   - /code/... (stateful code contexts: Python and any other language with a Jupyter
//     kernelspec in the image, spoken to over the Jupyter messaging protocol, and bash)
//   - /pty, /pty/{id}, /pty/{id}/ws (interactive shells on a pseudo-terminal or pipes
//     over WebSocket, with replay by byte offset and one holder at a time:
//     docs/spec/execd-pty.md)
//
// Streams are text/event-stream bodies of JSON objects each followed by a blank line.
// Every error answer is JSON {"code": "...", "message": "..."}.
//
// The package also supervises a child process when execd runs as PID 1
// (see Supervise): signals are forwarded, orphans reaped, the child's status returned.
package execd
