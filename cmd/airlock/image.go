package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/internal/buildinfo"
	"github.com/airlockdev/airlock/sandboximage"
	"github.com/airlockdev/airlock/stack"
)

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build and inspect sandbox images"}
	var (
		force    bool
		mirror   string
		workDir  string
		goKernel string
		execd    string
	)
	recipes := sandboximage.Recipes()
	names := make([]string, 0, len(recipes))
	for n := range recipes {
		names = append(names, n)
	}
	slices.Sort(names)
	build := &cobra.Command{
		Use:       "build [sandbox|code-interpreter|browser|desktop|execd|all]",
		Short:     "Build a sandbox image offline from Debian packages (default: the sandbox image), or the execd image",
		ValidArgs: append(slices.Clone(names), "execd", "all"),
		Long: `Builds an image with debootstrap and apt from a Debian mirror, then docker import. No
container registry is used. Each image records its recipe's hash; when an image with the
same recipe exists the build is skipped (--force rebuilds). Needs root and a running
Docker engine.

  sandbox (the default)  ` + sandboximage.Repository + `:<version> and :latest: a shell, the usual
                         tools, curl, Python with a Jupyter kernel. About two minutes.
  code-interpreter       ` + sandboximage.CodeInterpreterRepository + `:<version> and :latest: the sandbox
                         image plus Jupyter kernels for Python (ipykernel), JavaScript and
                         TypeScript (tslab, from the npm registry with the host's npm) and
                         Go (airlock-gokernel, found beside this binary or at --gokernel);
                         bash is served by execd itself. No Java kernel. Also git.
                         About three minutes.
  browser                ` + sandboximage.BrowserRepository + `:<version> and :latest: the sandbox image
                         plus Debian's Chromium and fonts; its entrypoint
                         ` + sandboximage.BrowserEntrypoint + ` starts headless Chromium with the
                         DevTools protocol on port 9222 (connect through the gateway).
  desktop                ` + sandboximage.DesktopRepository + `:<version> and :latest: the browser image
                         plus Xvfb, fluxbox, x11vnc and noVNC; its entrypoint
                         ` + sandboximage.DesktopEntrypoint + ` starts a desktop with Chromium, VNC
                         on port 5900 and noVNC on port 6080 (through the gateway).
  execd                  ` + sandboximage.ExecdRepository + `:<version> and :latest: the static execd (beside
                         this binary, or --execd) at /execd, run by each Kubernetes sandbox
                         pod's init container (execd --install). Seconds; needs no root.
  all                    all five.`,
		Args: cobra.MatchAll(cobra.MaximumNArgs(1), cobra.OnlyValidArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			which := []string{"sandbox"}
			if len(args) == 1 && args[0] == "all" {
				which = append(slices.Clone(names), "execd")
			} else if len(args) == 1 {
				which = args
			}
			if goKernel == "" {
				if exe, err := os.Executable(); err == nil {
					goKernel = filepath.Join(filepath.Dir(exe), "airlock-gokernel")
				}
			}
			docker, err := client.New(client.FromEnv)
			if err != nil {
				return err
			}
			defer docker.Close()
			b := &sandboximage.Builder{Docker: docker, Progress: os.Stdout, WorkDir: workDir, GoKernel: goKernel}
			for _, name := range which {
				if name == "execd" {
					if execd == "" {
						execd = stack.DefaultExecdPath()
					}
					fmt.Printf("==> image execd (%s)\n", sandboximage.ExecdRepository)
					res, err := b.BuildExecd(cmd.Context(), "", execd, buildinfo.Version, force)
					if err != nil {
						return fmt.Errorf("image execd: %w", err)
					}
					if res.Cached {
						fmt.Printf("==> image %s is current, nothing to build\n", res.Refs[0])
					}
					continue
				}
				r := recipes[name]
				if mirror != "" {
					r.Mirror = mirror
				}
				fmt.Printf("==> image %s (%s)\n", name, r.Repository)
				res, err := b.Build(cmd.Context(), r, buildinfo.Version, force)
				if err != nil {
					return fmt.Errorf("image %s: %w", name, err)
				}
				if res.Cached {
					fmt.Printf("==> image %s is current (%s), nothing to build\n", res.Refs[0], strings.TrimPrefix(res.ImageID, "sha256:")[:12])
				}
			}
			return nil
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even when the recipe is unchanged")
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror URL (default http://deb.debian.org/debian)")
	build.Flags().StringVar(&workDir, "work-dir", "", "directory for the temporary root (default $TMPDIR)")
	build.Flags().StringVar(&execd, "execd", "", "the static execd binary for the execd image (default: beside this binary, else /usr/local/lib/airlock/execd)")
	build.Flags().StringVar(&goKernel, "gokernel", "", "the airlock-gokernel binary for the code-interpreter image (default: beside this binary)")
	cmd.AddCommand(build)
	return cmd
}
