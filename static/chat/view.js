// The chat page's DOM (templates/chat/index.html) and the view state that is not the reducer's.
// Browser only: the page's modules share these; nothing here changes the reducer's state.

export const root = document.getElementById("app");
const $ = (selector) => root.querySelector(selector);
export const els = {
  conn: $('[data-testid="connection-status"]'),
  sidebarToggle: $('[data-testid="toggle-sidebar"]'),
  backdrop: $('[data-testid="sidebar-backdrop"]'),
  sessionList: $("#session-list"),
  newSession: $('[data-testid="new-session"]'),
  agentChoice: $(".agent-choice"),
  agentPicker: $('[data-testid="agent-picker"]'),
  search: $('[data-testid="session-search"]'),
  sessionEmpty: $("#session-empty"),
  loadMoreSessions: $('[data-testid="load-more-sessions"]'),
  title: $("#chat-title"),
  sub: $("#chat-sub"),
  agent: $("#chat-agent"),
  rename: $('[data-testid="rename-session"]'),
  reset: $('[data-testid="reset-session"]'),
  remove: $('[data-testid="delete-session"]'),
  notice: $("#notice"),
  noticeText: $("#notice .notice-text"),
  noticeClose: $("#notice .notice-close"),
  messages: $("#messages"),
  messageList: $("#message-list"),
  loadOlder: $('[data-testid="load-older"]'),
  emptyHint: $("#empty-hint"),
  form: $("#composer-form"),
  composer: $('[data-testid="composer"]'),
  send: $('[data-testid="send"]'),
  stop: $('[data-testid="stop"]'),
  status: $("#composer-status"),
  attachments: $("#composer-attachments"),
  attach: $('[data-testid="attach"]'),
  attachInput: $('[data-testid="attach-input"]'),
  dialog: $("#dialog"),
  dialogTitle: $("#dialog-title"),
  dialogText: $("#dialog-text"),
  dialogLabel: $("#dialog-label"),
  dialogInput: $("#dialog-input"),
  dialogConfirm: $('[data-testid="dialog-confirm"]'),
};

// Everything else this page keeps between events: view state that is not the reducer's.
export const page = {
  stickToBottom: true, // the next render scrolls the conversation to its end (a send, another session, first load)
  stopping: false, // the Stop button's chat.abort requests are in flight: it is disabled meanwhile
  searchTimer: null, // the sidebar search's debounce timer
  rowEls: new Map(), // session key -> its sidebar row (<li>)
  msgEls: new Map(), // conversation item id -> its message row, for the session `renderedKey`
  renderedKey: null, // the session whose messages are in the DOM
  renderedAgents: null, // the `state.agents` the agent picker was last built from
  countdownTimer: null, // ticks the approval countdowns once a second while one is shown
  revealApproval: null, // a session opened from its "needs approval" row: scroll its pending approval into view
  editing: null, // `{itemId, text}`: the user message whose editor is open (branches.js)
};
