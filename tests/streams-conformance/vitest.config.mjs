// Only this directory's tests; the suite's own timeouts, one file, no watch.
export default {
  test: {
    include: ["*.test.mjs"],
    testTimeout: 30000,
    hookTimeout: 30000,
    watch: false,
  },
}
