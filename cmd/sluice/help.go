package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// help is what "sluice COMMAND -h" prints above the flags: the usage line,
// what the command does and what it reads, an example, and after the
// flags its exit status.
type help struct {
	usage   string // "sluice take POLICY KEY [flags]"
	about   string // what it does, and what it reads (stdin, files)
	example string // one or more command lines
	exit    string // the exit status, after the flags
}

// quiet makes fs print nothing by itself: a parse error is returned once,
// and printed once by main; -h is answered by show.
func quiet(fs *flag.FlagSet) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
}

// show prints h and fs's flags to w.
func (h help) show(w io.Writer, fs *flag.FlagSet) error {
	fmt.Fprintf(w, "usage: %s\n\n%s\n\nexample:\n", h.usage, h.about)
	fmt.Fprintf(w, "  %s\n\nflags:\n", h.example)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	_, err := fmt.Fprintf(w, "\nexit status: %s\n", h.exit)
	return err
}

// parseErr turns a parse error of fs into what the command returns: after
// -h (flag.ErrHelp), h printed to stdout and errHelp, which exits 0; any
// other error with the command's name and where its flags are listed.
func (h help) parseErr(err error, name string, fs *flag.FlagSet, stdout io.Writer) error {
	if errors.Is(err, flag.ErrHelp) {
		if err := h.show(stdout, fs); err != nil {
			return err
		}
		return errHelp
	}
	return fmt.Errorf("%s: %w (sluice %s -h lists the flags)", name, err, name)
}

// errHelp is returned by a command that printed its help: the run
// succeeded and exits 0.
var errHelp = errors.New("help printed")
