// Package cli is the stockctl command: how operators and newcomers meet
// stockctl, and how scripts drive it.
//
// New builds the application; Main runs it on the process's arguments and
// returns the exit status. Every command builds its result as a plain value
// (the JSON shape of -o json) and renders it separately as a table; every
// failure is an error carrying one of the exit codes below, so that tests
// can run the whole application in-process without anything calling
// os.Exit.
//
// Flags, JSON field names and exit codes are a contract with scripts:
// change them only compatibly.
package cli
