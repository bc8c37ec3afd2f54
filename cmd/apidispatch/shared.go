package main

import (
	"flag"
	"os"

	"github.com/apidispatch/apidispatch/runner"
)

// sharedFlags are the flags of the shared budget (docs/design.md §12).
type sharedFlags struct {
	url, fallback, passwordFile string
}

func (s *sharedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.url, "shared", os.Getenv("APIDISPATCH_REDIS_URL"), "share one polite budget per key with every process on the same keys, in Redis at `URL` (redis://HOST:PORT/DB or rediss:// for TLS; env APIDISPATCH_REDIS_URL). A password in a URL on the command line is visible to every user in ps: prefer the env and --shared-password-file")
	fs.StringVar(&s.fallback, "shared-fallback", "", "'local': when Redis is unreachable at start, run each lane on a conservative local share (a quarter of its start limit) until Redis answers, instead of exiting with an error")
	fs.StringVar(&s.passwordFile, "shared-password-file", os.Getenv("APIDISPATCH_REDIS_PASSWORD_FILE"), "`FILE` holding the Redis AUTH password, instead of putting it in the URL (env APIDISPATCH_REDIS_PASSWORD_FILE)")
}

// shared is the shared budget the flags ask for (runner opens it).
func (s *sharedFlags) shared() runner.Shared {
	return runner.Shared{URL: s.url, PasswordFile: s.passwordFile, Fallback: s.fallback}
}
