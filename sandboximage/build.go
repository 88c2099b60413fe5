package sandboximage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// Builder builds images from recipes on a Docker engine. It shells out to debootstrap,
// chroot (apt inside the new root) and tar, so it needs root and the debootstrap package.
type Builder struct {
	Docker *client.Client
	// Progress receives one line per step and the tools' progress lines; nil discards.
	Progress io.Writer
	// WorkDir holds the temporary root; default os.TempDir(). It needs ~600 MB (~900 MB
	// for the code-interpreter image).
	WorkDir string
	// GoKernel is the path of a static airlock-gokernel binary, for recipes with GoKernel.
	GoKernel string

	steps, stepN int // progress: total steps of the current build, steps begun
}

// Result says what Build did.
type Result struct {
	// Refs are the tags the image carries, for example airlock/sandbox:0.1.0.
	Refs []string
	// Cached is true when an image with the same recipe existed and nothing was built.
	Cached bool
	// ImageID is the engine's id for the image.
	ImageID string
}

// ErrNotRoot is returned when the build needs root and the process is not.
var ErrNotRoot = errors.New("sandboximage: building an image needs root (debootstrap, chroot)")

// Build makes r.Repository:<version> and :latest from r unless an image with the same
// hash already carries both tags (or force). It removes its temporary root on every
// exit.
func (b *Builder) Build(ctx context.Context, r Recipe, version string, force bool) (Result, error) {
	if err := r.Validate(); err != nil {
		return Result{}, err
	}
	var kernel []byte
	if r.GoKernel {
		var err error
		if kernel, err = os.ReadFile(b.GoKernel); err != nil {
			return Result{}, fmt.Errorf("sandboximage: the Go kernel binary (make build writes bin/airlock-gokernel): %w", err)
		}
	}
	refs := []string{r.Repository + ":" + version, r.Repository + ":latest"}
	hash := r.ImageHash(kernel)
	if !force {
		if id, ok := b.cached(ctx, refs, hash); ok {
			return Result{Refs: refs, Cached: true, ImageID: id}, nil
		}
	}
	if os.Geteuid() != 0 {
		return Result{}, ErrNotRoot
	}
	tools := []string{"debootstrap", "chroot", "tar"}
	if len(r.NPM) > 0 {
		tools = append(tools, "npm")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return Result{}, fmt.Errorf("sandboximage: %s not found (apt-get install debootstrap npm)", tool)
		}
	}

	dir, err := os.MkdirTemp(b.WorkDir, "airlock-image-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root")
	start := time.Now()
	b.steps, b.stepN = 4, 0
	if len(r.NPM) > 0 {
		b.steps++
	}
	if r.Verify != "" {
		b.steps++
	}

	b.step("debootstrap %s (minbase) from %s", r.Suite, r.Mirror)
	if err := b.run(ctx, "debootstrap", "--variant=minbase", r.Suite, root, r.Mirror); err != nil {
		// A mirror's transient miss fails debootstrap outright: try once more from scratch.
		b.say("debootstrap failed, retrying once: %v", firstLine(err))
		if err := os.RemoveAll(root); err != nil {
			return Result{}, err
		}
		if err := b.run(ctx, "debootstrap", "--variant=minbase", r.Suite, root, r.Mirror); err != nil {
			return Result{}, fmt.Errorf("debootstrap: %w", err)
		}
	}

	b.step("apt-get install %s", strings.Join(r.Packages, " "))
	// The host's resolver for apt inside the root; finishRoot empties it again.
	if err := copyFile("/etc/resolv.conf", filepath.Join(root, "etc/resolv.conf")); err != nil {
		return Result{}, err
	}
	if r.Security != "" {
		if err := b.addSecurity(ctx, root, r); err != nil {
			return Result{}, err
		}
	}
	install := append([]string{root, "apt-get", "install", "-y", "--no-install-recommends", "-o", "Acquire::Retries=3"}, r.Packages...)
	if err := b.runEnv(ctx, chrootEnv, "chroot", install...); err != nil {
		return Result{}, fmt.Errorf("apt-get install: %w", err)
	}

	if len(r.NPM) > 0 {
		b.step("npm install -g %s (host npm, into /usr/local)", strings.Join(r.NPM, " "))
		args := append([]string{"install", "--global", "--prefix", filepath.Join(root, "usr/local"),
			"--omit=dev", "--no-audit", "--no-fund", "--no-update-notifier", "--loglevel=error"}, r.NPM...)
		if err := b.run(ctx, "npm", args...); err != nil {
			return Result{}, fmt.Errorf("npm install: %w", err)
		}
	}

	b.step("adding Airlock files and %d kernelspecs, trimming caches", len(r.Kernels))
	if err := finishRoot(root, r, kernel); err != nil {
		return Result{}, err
	}

	if r.Verify != "" {
		b.step("verifying the root")
		if err := b.runEnv(ctx, chrootEnv, "chroot", root, "/bin/bash", "-c", r.Verify); err != nil {
			return Result{}, fmt.Errorf("verify: %w", err)
		}
	}

	b.step("docker import as %s", strings.Join(refs, ", "))
	id, err := b.importRoot(ctx, root, r, hash, refs)
	if err != nil {
		return Result{}, err
	}
	b.say("built %s in %s", refs[0], time.Since(start).Round(time.Second))
	return Result{Refs: refs, ImageID: id}, nil
}

// chrootEnv is the environment of commands run inside the root.
var chrootEnv = []string{"DEBIAN_FRONTEND=noninteractive", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"}

// addSecurity adds r's security archive (<suite>-security main) to root's apt sources,
// refreshes the package lists and upgrades what debootstrap installed from it, so the
// install that follows takes the security updates too.
func (b *Builder) addSecurity(ctx context.Context, root string, r Recipe) error {
	line := fmt.Sprintf("deb %s %s-security main\n", r.Security, r.Suite)
	if err := os.WriteFile(filepath.Join(root, "etc/apt/sources.list.d/security.list"), []byte(line), 0o644); err != nil {
		return err
	}
	if err := b.runEnv(ctx, chrootEnv, "chroot", root, "apt-get", "update", "-o", "Acquire::Retries=3"); err != nil {
		return fmt.Errorf("apt-get update (%s-security): %w", r.Suite, err)
	}
	if err := b.runEnv(ctx, chrootEnv, "chroot", root, "apt-get", "upgrade", "-y", "--no-install-recommends", "-o", "Acquire::Retries=3"); err != nil {
		return fmt.Errorf("apt-get upgrade (%s-security): %w", r.Suite, err)
	}
	return nil
}

// cached reports whether every ref exists with the recipe hash label.
func (b *Builder) cached(ctx context.Context, refs []string, hash string) (string, bool) {
	var id string
	for _, ref := range refs {
		img, err := b.Docker.ImageInspect(ctx, ref)
		if err != nil || img.Config == nil || img.Config.Labels[RecipeLabel] != hash {
			return "", false
		}
		if id != "" && img.ID != id {
			return "", false
		}
		id = img.ID
	}
	return id, true
}

// finishRoot writes Airlock's files and r's kernelspecs into the root and removes what
// an image need not carry.
func finishRoot(root string, r Recipe, goKernel []byte) error {
	ci := filepath.Join(root, "opt/code-interpreter/code-interpreter.sh")
	if err := os.MkdirAll(filepath.Dir(ci), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(ci, codeInterpreterScript, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, "workspace"), 0o777); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(root, "workspace"), 0o1777); err != nil {
		return err
	}
	// nobody/nogroup come with Debian's base-passwd; check rather than trust.
	for file, entry := range map[string]string{"etc/passwd": "nobody:", "etc/group": "nogroup:"} {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "\n"+entry) && !strings.HasPrefix(string(b), entry) {
			return fmt.Errorf("sandboximage: %s has no %s entry", file, strings.TrimSuffix(entry, ":"))
		}
	}
	for p, content := range r.Files {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, []byte(content), 0o755); err != nil {
			return err
		}
	}
	if r.GoKernel {
		if err := os.WriteFile(filepath.Join(root, GoKernelPath), goKernel, 0o755); err != nil {
			return err
		}
	}
	for _, k := range r.Kernels {
		dir := filepath.Join(root, KernelDir, k.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		spec, err := json.MarshalIndent(struct {
			Argv          []string          `json:"argv"`
			DisplayName   string            `json:"display_name"`
			Language      string            `json:"language"`
			InterruptMode string            `json:"interrupt_mode"`
			Env           map[string]string `json:"env,omitempty"`
		}{k.Argv, k.DisplayName, k.Language, "signal", k.Env}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "kernel.json"), append(spec, '\n'), 0o644); err != nil {
			return err
		}
	}
	for _, pattern := range r.Remove {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/resolv.conf"), nil, 0o644); err != nil {
		return err
	}
	for _, junk := range []string{"var/lib/apt/lists", "var/cache/apt/archives", "usr/share/doc", "usr/share/man", "usr/share/info", "var/log"} {
		p := filepath.Join(root, junk)
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(root, "var/cache/apt/archives/partial"), 0o755)
}

// importRoot streams the root as a tar into the engine and tags it.
func (b *Builder) importRoot(ctx context.Context, root string, r Recipe, hash string, refs []string) (string, error) {
	tarCmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", "-", ".")
	out, err := tarCmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	var tarErr strings.Builder
	tarCmd.Stderr = &tarErr
	if err := tarCmd.Start(); err != nil {
		return "", err
	}
	changes := []string{
		"WORKDIR " + r.Workdir,
		`CMD ["/bin/bash"]`,
		fmt.Sprintf("LABEL %s=%s", RecipeLabel, hash),
	}
	for _, e := range r.Env {
		changes = append(changes, "ENV "+e)
	}
	for _, p := range r.Expose {
		changes = append(changes, fmt.Sprintf("EXPOSE %d/tcp", p))
	}
	resp, err := b.Docker.ImageImport(ctx, client.ImageImportSource{Source: out, SourceName: "-"}, refs[0],
		client.ImageImportOptions{Changes: changes, Message: "airlock image build, recipe " + hash})
	if err != nil {
		_ = tarCmd.Process.Kill()
		_ = tarCmd.Wait()
		return "", fmt.Errorf("docker import: %w", err)
	}
	id, importErr := readImportResult(resp)
	resp.Close()
	if err := tarCmd.Wait(); err != nil {
		return "", fmt.Errorf("tar: %w: %s", err, tarErr.String())
	}
	if importErr != nil {
		return "", fmt.Errorf("docker import: %w", importErr)
	}
	for _, ref := range refs[1:] {
		if _, err := b.Docker.ImageTag(ctx, client.ImageTagOptions{Source: refs[0], Target: ref}); err != nil {
			return "", fmt.Errorf("docker tag %s: %w", ref, err)
		}
	}
	return id, nil
}

// readImportResult reads the engine's JSON message stream and returns the image id.
func readImportResult(rd io.Reader) (string, error) {
	dec := json.NewDecoder(rd)
	var id string
	for {
		var m struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return id, nil
		} else if err != nil {
			return "", err
		}
		if m.Error != "" {
			return "", errors.New(m.Error)
		}
		if strings.HasPrefix(m.Status, "sha256:") {
			id = m.Status
		}
	}
}

func (b *Builder) step(format string, args ...any) {
	b.stepN++
	b.say("[%d/%d] %s", b.stepN, b.steps, fmt.Sprintf(format, args...))
}

func (b *Builder) say(format string, args ...any) {
	if b.Progress != nil {
		fmt.Fprintf(b.Progress, "==> "+format+"\n", args...)
	}
}

func (b *Builder) run(ctx context.Context, name string, args ...string) error {
	return b.runEnv(ctx, nil, name, args...)
}

// runEnv runs a tool, forwarding its progress lines (debootstrap's "I:" lines, apt's
// "Setting up" lines) and keeping the last lines for the error.
func (b *Builder) runEnv(ctx context.Context, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	tail := make([]string, 0, 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if len(tail) == cap(tail) {
				tail = tail[1:]
			}
			tail = append(tail, line)
			if b.Progress != nil && (strings.HasPrefix(line, "I: Retrieving") || strings.HasPrefix(line, "I: Base system") ||
				strings.HasPrefix(line, "Setting up") || strings.HasPrefix(line, "E:") ||
				strings.HasPrefix(line, "added ") || strings.HasPrefix(line, "npm ERR") || strings.HasPrefix(line, "npm error")) {
				fmt.Fprintln(b.Progress, "    "+line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%w\n%s", err, strings.Join(tail, "\n"))
	}
	return nil
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
