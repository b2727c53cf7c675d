package main

import (
	"github.com/spf13/cobra"
)

// addCompletions teaches shell completion the values of enumerated flags
// (--backend, --log-level, --log-format) on every command that has them,
// and krfs res its two positions: a mount point, then a resource kind.
func addCompletions(root *cobra.Command) {
	values := map[string][]string{
		"backend":    {"auto", "softnic", "rdma"},
		"log-level":  {"debug", "info", "warn", "error"},
		"log-format": {"text", "json"},
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for name, vs := range values {
			if c.Flags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(vs, cobra.ShellCompDirectiveNoFileComp))
			}
		}
		if c.Name() == "res" {
			kinds := c.ValidArgs
			c.ValidArgs = nil
			c.ValidArgsFunction = func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
				switch len(args) {
				case 0:
					return nil, cobra.ShellCompDirectiveFilterDirs
				case 1:
					return kinds, cobra.ShellCompDirectiveNoFileComp
				}
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
