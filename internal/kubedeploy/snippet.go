package kubedeploy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The placeholders of the SDK snippet in deploy/kubernetes/README.md (step 6): the
// lifecycle API address of the port-forward, the API key and the sandbox image.
const (
	SnippetDomain = `"127.0.0.1:8080"`
	SnippetAPIKey = `"<the api-key>"`
	SnippetImage  = `"registry.example.com/airlock/sandbox:latest"`
)

var jsBlock = regexp.MustCompile("(?s)```js\n(.*?)```")

// SDKSnippet returns the JavaScript of readme's one js block (the operator README's SDK
// snippet) with its three placeholders replaced by domain (the lifecycle API's
// host:port), apiKey and image, as JavaScript string literals. `make kube-up` prints it
// and the node tests run it, so neither can drift from the README. An error names what
// does not hold: not exactly one js block, or a placeholder not exactly once in it.
func SDKSnippet(readme []byte, domain, apiKey, image string) (string, error) {
	blocks := jsBlock.FindAllSubmatch(readme, -1)
	if len(blocks) != 1 {
		return "", fmt.Errorf("kubedeploy: the README has %d js blocks, want the one SDK snippet", len(blocks))
	}
	// The block may be indented inside a list item.
	js := string(blocks[0][1])
	lines := strings.Split(js, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, strings.Repeat(" ", indent))
	}
	js = strings.Join(lines, "\n")
	for _, r := range [][2]string{{SnippetDomain, domain}, {SnippetAPIKey, apiKey}, {SnippetImage, image}} {
		if n := strings.Count(js, r[0]); n != 1 {
			return "", fmt.Errorf("kubedeploy: the README's SDK snippet names %s %d times, want once", r[0], n)
		}
		js = strings.Replace(js, r[0], strconv.Quote(r[1]), 1)
	}
	return js, nil
}
