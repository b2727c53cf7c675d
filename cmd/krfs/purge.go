package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/krfs/krfs/internal/shm"
	"github.com/krfs/krfs/node"
	"github.com/spf13/cobra"
)

// purgeCmd frees region memory that no daemon holds (node.Purge), or
// lists the stores (--list).
func purgeCmd(stdout io.Writer) *cobra.Command {
	var list bool
	cmd := &cobra.Command{
		Use:   "purge [DIR] | purge --list",
		Short: "Free region memory no daemon holds (the region files of DIR, or of every /dev/shm/krfs-* store); --list shows the stores",
		Long: "Delete the region files, lock and directory of a store no running daemon holds (their contents are lost, and so is the\n" +
			"identity the store keeps: the node's gid, address and key).\n" +
			"Without DIR, every /dev/shm/krfs-* store not in use. A store in use is refused and named, and left untouched.\n" +
			"--list prints every /dev/shm/krfs-* store: the gid and address of the node it remembers, the memory its regions\n" +
			"hold, and the daemon holding it (or free: left by a node that has not come back, for instance with another gid).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if list {
				if len(args) != 0 {
					return fmt.Errorf("%w: --list takes no DIR", errUsage)
				}
				return listStores(stdout)
			}
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
	cmd.Flags().BoolVar(&list, "list", false, "list the stores under /dev/shm and what each remembers, purge nothing")
	return cmd
}

// listStores prints shm.List as a table.
func listStores(stdout io.Writer) error {
	stores, err := shm.List()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "STORE\tGID\tLISTEN\tBYTES\tSTATE")
	for _, s := range stores {
		gid, listen := "-", "-"
		if s.Identity.GID != 0 {
			gid, listen = fmt.Sprint(s.Identity.GID), s.Identity.Listen
		}
		state := "free"
		switch {
		case s.Err != nil:
			state = "unreadable: " + s.Err.Error()
		case s.HeldBy != "":
			state = "in use by pid " + s.HeldBy
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", s.Dir, gid, listen, s.Bytes, state)
	}
	return w.Flush()
}
