// Command execd is the execution daemon inside every sandbox (see package execd).
package main

func main() {}
