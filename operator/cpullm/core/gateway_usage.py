"""Usage per team and model, counted by the gateway for chargeback: HAProxy loads USAGE_LUA, whose filter reads the
end of each answer a service sends back for its `usage` (prompt and completion tokens, as vLLM reports them; a
stream carries it in its last chunk when the request asked `stream_options.include_usage`), and whose service
answers GET /usage on the health port in Prometheus' text format. Counters are per pod and start again at 0 when
HAProxy reloads (a key rotation): Prometheus' rate() and increase() read resets as such. The same counts, per team
and second over the last minute, hold a team to its generatedTokensPerMinute (the action GENERATED_ACTION).
https://docs.haproxy.org/2.6/configuration.html#lua-load, HAProxy's Lua API (Filter class, register_action).
"""

from __future__ import annotations

USAGE_FILE = "usage.lua"
USAGE_PATH = "/usage"  # on the gateway's health port
# `http-request lua.generated_window LIMIT`: sets txn.generated_retry (the seconds until the team's oldest counted
# tokens leave the window) when the team's tokens generated in the last WINDOW seconds reach LIMIT.
GENERATED_ACTION = "generated_window"
GENERATED_RETRY = "txn.generated_retry"

USAGE_LUA = r"""-- cpullm gateway: usage per team and model (core/gateway_usage.py).
local counts = {}   -- "team model" -> {team, model, requests, prompt, generated, unmetered}
local TAIL = 8192   -- the end of an answer kept: its usage is there

local function count(team, model)
  local key = team .. " " .. model
  local entry = counts[key]
  if entry == nil then
    entry = {team = team, model = model, requests = 0, prompt = 0, generated = 0, unmetered = 0}
    counts[key] = entry
  end
  return entry
end

local WINDOW = 60   -- seconds of generated tokens a team's generatedTokensPerMinute counts
local generated = {} -- team -> {second -> tokens generated in that second}

-- The team's seconds within the window (older ones dropped), their tokens and the oldest second.
local function window(team, now)
  local seconds = generated[team]
  if seconds == nil then
    seconds = {}
    generated[team] = seconds
  end
  local total, oldest = 0, nil
  for second, tokens in pairs(seconds) do
    if second <= now - WINDOW then
      seconds[second] = nil
    else
      total = total + tokens
      if oldest == nil or second < oldest then oldest = second end
    end
  end
  return seconds, total, oldest
end

local function last(text, field)
  local found = nil
  for value in string.gmatch(text, '"' .. field .. '"%s*:%s*(%d+)') do found = value end
  return tonumber(found)
end

local Usage = {id = "cpullm-usage", flags = filter.FLT_CFG_FL_HTX}
Usage.__index = Usage

function Usage:new()
  return setmetatable({tail = ""}, Usage)
end

function Usage:start_analyze(txn, chn)
  if chn:is_resp() then filter.register_data_filter(self, chn) end
  return filter.CONTINUE
end

function Usage:http_payload(txn, msg)
  local body = msg:body()
  if body ~= nil and #body > 0 then self.tail = string.sub(self.tail .. body, -TAIL) end
end

function Usage:http_end(txn, msg)
  if not msg.channel:is_resp() then return filter.CONTINUE end
  local team, model = txn:get_var("txn.team"), txn:get_var("txn.model")
  if txn:get_var("txn.routed") == nil or team == nil or model == nil then return filter.CONTINUE end
  local entry = count(team, model)
  entry.requests = entry.requests + 1
  local prompt, generated = last(self.tail, "prompt_tokens"), last(self.tail, "completion_tokens")
  if prompt == nil or generated == nil then
    entry.unmetered = entry.unmetered + 1
  else
    entry.prompt = entry.prompt + prompt
    entry.generated = entry.generated + generated
    local now = core.now().sec
    local seconds = window(team, now)
    seconds[now] = (seconds[now] or 0) + generated
  end
  return filter.CONTINUE
end

core.register_action("generated_window", {"http-req"}, function(txn, limit)
  local team = txn:get_var("txn.team")
  if team == nil then return end
  local now = core.now().sec
  local _, total, oldest = window(team, now)
  if total >= tonumber(limit) then
    txn:set_var("txn.generated_retry", math.max(1, oldest + WINDOW - now))
  end
end, 1)

core.register_filter("usage", Usage, function(usage, args) return usage end)

local METRICS = {
  {"requests", "cpullm_gateway_requests_total", "Answers a service sent back through the gateway."},
  {"prompt", "cpullm_gateway_prompt_tokens_total", "Prompt tokens, as the answers' usage says."},
  {"generated", "cpullm_gateway_generation_tokens_total", "Generated tokens, as the answers' usage says."},
  {"unmetered", "cpullm_gateway_unmetered_requests_total",
   "Answers without a usage (a stream that did not ask stream_options.include_usage)."},
}

core.register_service("usage", "http", function(applet)
  local lines = {}
  for _, metric in ipairs(METRICS) do
    table.insert(lines, "# HELP " .. metric[2] .. " " .. metric[3])
    table.insert(lines, "# TYPE " .. metric[2] .. " counter")
    for _, entry in pairs(counts) do
      table.insert(lines, string.format('%s{team="%s",model="%s"} %d', metric[2], entry.team, entry.model,
        entry[metric[1]]))
    end
  end
  local text = table.concat(lines, "\n") .. "\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", string.len(text))
  applet:start_response()
  applet:send(text)
end)
"""
