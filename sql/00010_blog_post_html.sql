-- A post's Markdown is rendered once, when it is written, and the HTML kept beside it: public pages
-- and feeds serve it as stored, so no reader's request runs the renderer (which needs seconds for
-- some inputs of the allowed size). Null for posts written before: the first public view renders
-- and stores theirs.
alter table blog_posts add column content_html text;
