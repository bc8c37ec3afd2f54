//go:build race

package campaign

func init() { raceBuild = true }
