package main

import (
	"fmt"
	"io"

	"github.com/krfs/krfs/node"
	"github.com/spf13/cobra"
)

// purgeCmd frees region memory that no daemon holds (node.Purge).
func purgeCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "purge [DIR]",
		Short: "Free region memory no daemon holds (the region files of DIR, or of every /dev/shm/krfs-* store)",
		Long:  "Delete the region files, lock and directory of a store no running daemon holds (their contents are lost).\nWithout DIR, every /dev/shm/krfs-* store not in use. A store in use is refused and named, and left untouched.",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 1 {
				dir = args[0]
			}
			removed, err := node.Purge(dir)
			for _, d := range removed {
				fmt.Fprintf(stdout, "removed %s\n", d)
			}
			return err
		},
	}
}
