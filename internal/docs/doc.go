// Package docs holds the tests that keep the repository's documentation
// whole: no reference to a document outside the repository, no dead
// relative link or anchor in any Markdown file, a README a newcomer reads
// in five minutes, and an ARCHITECTURE.md whose walks through the source
// name functions that exist. It has no code of its own.
package docs
