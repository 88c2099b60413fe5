// Package codetest is the per-language code-context test that execd's and the Go SDK's
// integration tests share: for each language of the code-interpreter image, state kept
// across runs, an error with its name and traceback, an interrupted loop that leaves the
// context usable, and stdout streamed in order while the code runs.
package codetest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Event is one stream event as a client saw it, with its arrival time.
type Event struct {
	Type      string // init, stdout, stderr, result, error, execution_complete, ...
	Text      string
	ErrName   string
	Traceback []string
	At        time.Time
}

// Client runs code in a sandbox's code contexts (execd's /code API, directly or through
// an SDK).
type Client interface {
	// CreateContext starts a context and returns its id.
	CreateContext(ctx context.Context, language string) (string, error)
	// Run runs code in context id, calling on for every event as it arrives, until the
	// stream ends.
	Run(ctx context.Context, id, code string, on func(Event)) error
	// Interrupt interrupts the code running in context id.
	Interrupt(ctx context.Context, id string) error
}

// Case is one language's code for the checks.
type Case struct {
	Language string
	// Define sets x to 41; Read prints x + 1.
	Define, Read string
	// Fail fails with the error named ErrName.
	Fail, ErrName string
	// Loop runs until interrupted.
	Loop string
	// Stream prints 1, 2 and 3, sleeping 400 ms after each.
	Stream string
}

// Cases are the code-interpreter image's languages (Java has no kernel).
var Cases = []Case{
	{
		Language: "python",
		Define:   "x = 41", Read: "print(x + 1)",
		Fail: "1 / 0", ErrName: "ZeroDivisionError",
		Loop:   "while True:\n    pass",
		Stream: "import time\nfor i in (1, 2, 3):\n    print(i, flush=True)\n    time.sleep(0.4)",
	},
	{
		Language: "javascript",
		Define:   "var x = 41", Read: "console.log(x + 1)",
		Fail: "[].reduce((a, b) => a + b)", ErrName: "TypeError",
		Loop:   "while (true) {}",
		Stream: "for (const i of [1, 2, 3]) {\n  console.log(i);\n  await new Promise((r) => setTimeout(r, 400));\n}",
	},
	{
		Language: "typescript",
		Define:   "let x: number = 41", Read: "console.log(x + 1)",
		Fail: "throw new RangeError(\"out of range\")", ErrName: "RangeError",
		Loop:   "while (true) {}",
		Stream: "for (const i of [1, 2, 3]) {\n  console.log(i);\n  await new Promise<void>((r) => setTimeout(r, 400));\n}",
	},
	{
		Language: "go",
		Define:   "import \"fmt\"\nx := 41", Read: "fmt.Println(x + 1)",
		Fail: "var m map[string]int\nm[\"a\"] = 1", ErrName: "panic",
		Loop:   "spin := 0\nfor {\n\tspin++\n}",
		Stream: "import \"time\"\nfor i := 1; i <= 3; i++ {\n\tfmt.Println(i)\n\ttime.Sleep(400 * time.Millisecond)\n}",
	},
	{
		Language: "bash",
		Define:   "x=41", Read: "echo $((x + 1))",
		Fail: "ls /nonexistent", ErrName: "CommandExecError",
		Loop:   "while true; do :; done",
		Stream: "for i in 1 2 3; do echo $i; sleep 0.4; done",
	},
}

// Check runs every check of c against one new context.
func Check(t *testing.T, cl Client, c Case) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id, err := cl.CreateContext(ctx, c.Language)
	if err != nil {
		t.Fatalf("create %s context: %v", c.Language, err)
	}
	run := func(code string) []Event {
		t.Helper()
		var evs []Event
		if err := cl.Run(ctx, id, code, func(e Event) { evs = append(evs, e) }); err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		return evs
	}
	readsState := func(when string) {
		t.Helper()
		evs := run(c.Read)
		if out := stdout(evs); strings.TrimSpace(out) != "42" || last(evs).Type != "execution_complete" {
			t.Errorf("%s: read state: stdout %q, events %v", when, out, types(evs))
		}
	}

	if evs := run(c.Define); last(evs).Type != "execution_complete" {
		t.Fatalf("define: %+v", evs)
	}
	readsState("second run")

	evs := run(c.Fail)
	if e := last(evs); e.Type != "error" || e.ErrName != c.ErrName || len(e.Traceback) == 0 {
		t.Errorf("error: want %s with a traceback, got last event %+v", c.ErrName, e)
	}
	readsState("after an error")

	// Interrupt a loop a second after its stream opened.
	started := make(chan struct{}, 1)
	done := make(chan []Event, 1)
	go func() {
		var evs []Event
		err := cl.Run(ctx, id, c.Loop, func(e Event) {
			evs = append(evs, e)
			if e.Type == "init" {
				started <- struct{}{}
			}
		})
		if err != nil {
			t.Errorf("loop: %v", err)
		}
		done <- evs
	}()
	select {
	case <-started:
	case evs := <-done:
		t.Fatalf("loop ended on its own: %+v", evs)
	}
	time.Sleep(time.Second)
	// A kernel under load may not be in the loop yet when the first SIGINT lands (tslab
	// drops an interrupt that finds nothing running): interrupt again every 5 s.
	deadline := time.After(20 * time.Second)
wait:
	for {
		if err := cl.Interrupt(ctx, id); err != nil {
			t.Fatalf("interrupt: %v", err)
		}
		select {
		case evs := <-done:
			if e := last(evs); e.Type != "error" {
				t.Errorf("interrupted loop: want an error event last, got %v", types(evs))
			}
			break wait
		case <-time.After(5 * time.Second):
		case <-deadline:
			t.Fatal("the loop did not stop within 20 s of the first interrupt")
		}
	}
	readsState("after an interrupt")

	// Streaming: three lines, in order, each its own event, the first well before the end.
	evs = run(c.Stream)
	var lines []string
	var first time.Time
	n := 0
	for _, e := range evs {
		if e.Type == "stdout" {
			n++
			if first.IsZero() {
				first = e.At
			}
			lines = append(lines, strings.Fields(e.Text)...)
		}
	}
	end := last(evs)
	if strings.Join(lines, ",") != "1,2,3" || n < 3 || end.Type != "execution_complete" {
		t.Errorf("stream: lines %q in %d stdout events, events %v", lines, n, types(evs))
	} else if gap := end.At.Sub(first); gap < 600*time.Millisecond {
		t.Errorf("stream: the first line came %s before the end: output was not streamed", gap)
	}
}

func stdout(evs []Event) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Type == "stdout" {
			b.WriteString(e.Text)
			if !strings.HasSuffix(e.Text, "\n") {
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

func last(evs []Event) Event {
	if len(evs) == 0 {
		return Event{}
	}
	return evs[len(evs)-1]
}

func types(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
		if e.Type == "error" {
			out[i] += "(" + e.ErrName + ")"
		}
	}
	return out
}
