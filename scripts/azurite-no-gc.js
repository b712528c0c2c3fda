// Preloaded into the Azurite emulator (NODE_OPTIONS="--require <this file>"): turns its extent
// garbage collection off. Its sweep removes unreferenced extents one at a time, each removal
// re-sorting the extents index, with the event loop blocked throughout: after a test run deletes
// its container (2,500 blobs), the emulator answers nothing for seconds, after larger deletions
// for minutes, and every lease renewal in flight times out. leasehold's blobs are empty, so the
// extents left unswept cost little memory.
const path = require("path");
const gc = path.join(__dirname, "npm/node_modules/azurite/dist/src/blob/gc/BlobGCManager");
require(gc).default.prototype.markSweep = async function markSweep() {};
