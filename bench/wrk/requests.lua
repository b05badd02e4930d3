-- The bench's requests for wrk (bench/lib/wrk.ts runs it): one agent key per request, read from a
-- file of lines ("key" or "key<TAB>userId") at each thread's start, and a JSON summary at the end.
-- Arguments after wrk's `--`: file, order, first, step, kind, path, statuses.
--   order "random": every request takes a random line (the poll, the bare route, replies).
--   order "once": each line is taken once, in order from line `first` (0-based); thread i takes
--     first + i, first + i + step, ... (step = the thread count), and stops when the lines run out.
--   kind "get": GET path with the key; "reply": POST path with the key and {"userId", "text"}.
--   statuses "1": count responses by status (wrk then parses every response: only where it is cheap
--     beside the request's own cost); otherwise wrk counts statuses above 399 itself.

local threads = {}

function setup(thread)
  thread:set("index", #threads)
  threads[#threads + 1] = thread
end

-- Per thread; read back by done() through thread:get.
index = 0
taken = 0
next_line = 0
exhausted = false
statuses = {}

local lines, count, order, position, step, kind, path, built
local sent = 0

local function build(line)
  local tab = line:find("\t", 1, true)
  local key = tab and line:sub(1, tab - 1) or line
  if kind == "reply" then
    sent = sent + 1
    local body = '{"userId":"' .. line:sub(tab + 1) .. '","text":"Here is the summary, part ' .. sent .. '."}'
    return wrk.format("POST", path, { ["X-API-Key"] = key, ["Content-Type"] = "application/json" }, body)
  end
  return wrk.format("GET", path, { ["X-API-Key"] = key })
end

function init(args)
  -- args[0] is the URL; the script's own arguments follow it.
  local file = args[1]
  order, position, step, kind, path = args[2], tonumber(args[3]), tonumber(args[4]), args[5], args[6]
  if args[7] ~= "1" then response = nil end
  lines, count = {}, 0
  for line in io.lines(file) do
    count = count + 1
    lines[count] = line
  end
  if count == 0 then error("no lines in " .. file) end
  position = position + index
  next_line = position
  math.randomseed(os.time() * 16 + index)
  -- A GET is the same few bytes each time for a key: built on its first use, then looked up.
  if order == "random" and kind == "get" then built = {} end
end

function request()
  if order == "random" then
    local i = math.random(count)
    if not built then return build(lines[i]) end
    local r = built[i]
    if not r then
      r = build(lines[i])
      built[i] = r
    end
    return r
  end
  if position >= count then
    -- Out of lines: stop; the request sent meanwhile is a harmless one, and the run is reported exhausted.
    exhausted = true
    wrk.thread:stop()
    return wrk.format("GET", "/health")
  end
  local line = lines[position + 1]
  taken = taken + 1
  next_line = position + 1
  position = position + step
  return build(line)
end

function response(status)
  local s = tostring(status)
  statuses[s] = (statuses[s] or 0) + 1
end

-- Latency quantiles for merging runs: every 0.5 % to 99 %, then every 0.05 % (µs).
local function quantiles(latency)
  local out = {}
  for i = 1, 198 do out[#out + 1] = string.format("[%.2f,%d]", i / 2, latency:percentile(i / 2)) end
  for i = 1, 19 do out[#out + 1] = string.format("[%.2f,%d]", 99 + i / 20, latency:percentile(99 + i / 20)) end
  -- wrk's percentile(100) ranks past the last sample and answers 0.
  out[#out + 1] = string.format("[100,%d]", latency.max)
  return "[" .. table.concat(out, ",") .. "]"
end

function done(summary, latency, requests)
  local merged, all_taken, next_free, out_of_lines = {}, 0, 0, false
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do merged[status] = (merged[status] or 0) + n end
    all_taken = all_taken + thread:get("taken")
    next_free = math.max(next_free, thread:get("next_line"))
    out_of_lines = out_of_lines or thread:get("exhausted")
  end
  local by_status = {}
  for status, n in pairs(merged) do by_status[#by_status + 1] = string.format('"%s":%d', status, n) end
  local e = summary.errors
  -- With no response at all wrk's minimum is still its initial UINT64_MAX.
  local min = summary.requests > 0 and latency.min or 0
  io.write(string.format(
    'wrk-json {"requests":%d,"durationUs":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latencyUs":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p99":%d},"quantiles":%s,"statuses":{%s},"taken":%d,"next":%d,"exhausted":%s}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    min, latency.mean, latency.max, latency:percentile(50), latency:percentile(99), quantiles(latency),
    table.concat(by_status, ","), all_taken, next_free, tostring(out_of_lines)))
end
