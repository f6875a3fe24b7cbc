// Package release checks how tfstackplan is shipped where no tool here can: the container
// image of `tfstackplan serve` (the Dockerfile, built by docker, which this machine does not
// run). Its tests read the Dockerfile's invariants (a static cgo-free build, an empty base, a
// non-root user, /data as the volume and working directory, serve as the entrypoint), check
// that .dockerignore keeps nothing the build needs out, build the binary with the Dockerfile's
// own build command, and run its entrypoint as the image would: as that user, with every file
// system read-only but the data directory. The release archives are checked by
// internal/actionlint, against the action that installs them. The package has no code of its own.
package release
