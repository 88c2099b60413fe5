package main

import (
	"fmt"
	"os"

	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/airlockdev/airlock/internal/buildinfo"
	"github.com/airlockdev/airlock/sandboximage"
)

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build and inspect sandbox images"}
	var (
		force   bool
		mirror  string
		workDir string
	)
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the default sandbox image offline from Debian packages",
		Long: `Builds ` + sandboximage.Repository + `:<version> (also :latest) with debootstrap and apt from a
Debian mirror, then docker import. No container registry is used. The image records its
recipe's hash; when an image with the same recipe exists the build is skipped (--force
rebuilds). Needs root and a running Docker engine; takes about two minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			docker, err := client.New(client.FromEnv)
			if err != nil {
				return err
			}
			defer docker.Close()
			r := sandboximage.DefaultRecipe()
			if mirror != "" {
				r.Mirror = mirror
			}
			b := &sandboximage.Builder{Docker: docker, Progress: os.Stdout, WorkDir: workDir}
			res, err := b.Build(cmd.Context(), r, buildinfo.Version, force)
			if err != nil {
				return err
			}
			if res.Cached {
				fmt.Printf("==> image %s is current (recipe %s), nothing to build\n", res.Refs[0], r.Hash())
			}
			return nil
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even when the recipe is unchanged")
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror URL (default http://deb.debian.org/debian)")
	build.Flags().StringVar(&workDir, "work-dir", "", "directory for the temporary root (default $TMPDIR)")
	cmd.AddCommand(build)
	return cmd
}
